#include "mmap_option.hpp"

#include <CLI/CLI.hpp>

namespace numesh::tools {

void add_mmap_option(CLI::App& cmd, std::string& value) {
  cmd.add_option("--mmap", value,
                 "Whether the matrices read the model file's pages in place (on: no copy and no "
                 "memory of their own, the page cache's pages shared by every process that maps "
                 "the file) or copies in each device's memory of its NUMA node (off). Only a "
                 "matrix stored as the file stores it, in whole rows per device, can be read in "
                 "place; the others are copied. auto: on for a machine of one NUMA node, off for "
                 "one of several, and the matrices whose panels pay copied into them (their faster "
                 "order: q8_0's and q4_0's products of several rows, and q4_0's of one, from AVX2 "
                 "on); on reads those in place too, as rows: a quicker load, slower products. In "
                 "place, "
                 "the file must not be overwritten while the model runs "
                 "(numesh's own writers replace files whole, which is safe)")
      ->capture_default_str();
}

}  // namespace numesh::tools
