#include "convert_command.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <ostream>

#include "bench_common.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/models/engine/gguf_export.hpp"
#include "numesh/models/engine/model_source.hpp"

namespace numesh::tools {

CLI::App* add_convert_command(CLI::App& app, ConvertOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "convert", "Write a model as a GGUF file (llama.cpp's format), its matrices in one format.");
  cmd->footer(
      R"(Writes the metadata llama.cpp's converter writes for the architecture (llama, mistral and
mixtral as "llama", qwen2, qwen3, qwen2moe, qwen3moe, gemma, phi3), the tokenizer (tokenizer.json
as "gpt2", tokenizer.model as "llama") and the chat template, and every weight under its GGUF
name: the experts stacked, the q/k rows of Llama-family models permuted as llama.cpp's converter
permutes them, Gemma's norms as 1 + w, Phi-3's qkv_proj and gate_up_proj whole, norms, biases
and routers in F32, the matrices in --type (GGML's reference quantizers for
the block formats; a matrix whose rows are not whole blocks goes F16, as llama.cpp does).
numesh reads the file back with --model FILE.gguf.
Examples:
  numesh convert --model ~/models/Qwen3-0.6B --out qwen3-0.6b-q8_0.gguf --type q8_0
  numesh convert --model ~/models/Llama-3.2-1B --out llama-3.2-1b-f16.gguf)");
  cmd->add_option("--model", o.model, "Model folder (config.json, *.safetensors) or a GGUF file")
      ->required();
  cmd->add_option("--out", o.out, "The GGUF file to write (replaced)")->required();
  cmd->add_option("--type", o.type, fmt::format("The matrices' format: {}", dtype_choices()))
      ->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "No progress on stderr");
  return cmd;
}

int run_convert(const ConvertOptions& o, std::ostream& out) {
  const DType format = parse_dtype(o.type);
  const std::filesystem::path file = o.out;
  NUMESH_CHECK(file.extension() == ".gguf", ValueError, "--out '{}' must name a .gguf file", o.out);
  const models::ModelSource source = models::ModelSource::open(o.model);
  for (const std::filesystem::path& f : source.weight_files()) {
    std::error_code ec;
    NUMESH_CHECK(!std::filesystem::equivalent(f, file, ec), ValueError,
                 "--out '{}' is one of the model's own files", o.out);
  }
  const ProgressLine line(o.quiet);
  const auto start = std::chrono::steady_clock::now();
  const models::GgufExportReport r =
      models::write_gguf(source, file, format, [&](std::uint64_t done, std::uint64_t total) {
        line.update(fmt::format("converting {:.0f}%",
                                100.0 * static_cast<double>(done) / static_cast<double>(total)));
      });
  std::string formats;
  for (const auto& [name, count] : r.formats)
    formats += fmt::format("{}{} {}", formats.empty() ? "" : ", ", count, name);
  out << fmt::format(
      "numesh convert: {} ({} model) -> {}: {} tensors ({}), {:.1f} MB in {:.2f} s; tokenizer "
      "{}, chat template {}\n",
      o.model, to_string(source.config().architecture), o.out, r.tensors, formats,
      static_cast<double>(r.bytes) / 1e6, seconds_since(start), r.tokenizer ? "written" : "none",
      r.chat_template ? "written" : "none");
  if (!r.tokenizer_lost.empty()) out << "note: " << r.tokenizer_lost << "\n";
  if (r.fallbacks > 0) {
    out << fmt::format(
        "note: {} matrices have rows that are not whole blocks of {}; written as f16\n",
        r.fallbacks, to_string(format));
  }
  return 0;
}

}  // namespace numesh::tools
