#include "kv_layout_option.hpp"

#include <CLI/CLI.hpp>

namespace numesh::tools {

void add_kv_layout_option(CLI::App& cmd, std::string& value) {
  cmd.add_option("--kv-layout", value,
                 "KV cache layout: bhtd (each kv head's positions contiguous, as the models keep "
                 "their caches; a decode step reads each head's keys in one run) or bthd")
      ->capture_default_str();
}

}  // namespace numesh::tools
