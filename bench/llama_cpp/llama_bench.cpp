// llama.cpp's own library driven as llama-bench drives it (one process, its persistent thread
// pool), the baseline of docs/benchmarks.md ("End to end against llama.cpp"): a GGUF file
// loaded, the prompt's ids prefilled in one batch, then greedy decoding, one token a
// llama_decode. Built by run.sh against the prebuilt CPU libraries that the npm package
// node-llama-cpp installs (and the llama.cpp source bundled with it, for the headers).
//   llama_bench BACKEND_DIR FILE.gguf IDS_FILE NEW_TOKENS THREADS
// Prints one JSON line: load seconds, prefill and decode tokens/s, the greedy ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace {

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: llama_bench BACKEND_DIR FILE.gguf IDS_FILE NEW_TOKENS THREADS\n");
    return 2;
  }
  ggml_backend_load_all_from_path(argv[1]);  // the CPU variants, picked for this CPU
  llama_backend_init();
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  const auto load = std::chrono::steady_clock::now();
  llama_model* model = llama_model_load_from_file(argv[2], mp);
  if (model == nullptr) {
    std::fprintf(stderr, "llama_bench: llama.cpp cannot load %s\n", argv[2]);
    return 1;
  }
  const double load_seconds = since(load);
  std::ifstream in(argv[3]);
  std::stringstream text(std::string(std::istreambuf_iterator<char>(in), {}));
  std::vector<llama_token> ids;
  for (std::string id; std::getline(text, id, ',');) ids.push_back(std::stoi(id));
  const int n = std::stoi(argv[4]);
  const int prompt = static_cast<int>(ids.size());
  llama_context_params cp = llama_context_default_params();
  // A context of 1024 at least; the prompt in one llama_decode (n_batch), which llama.cpp runs
  // in micro-batches of 512 (its default n_ubatch, numesh's default --prefill-chunk).
  cp.n_ctx = std::max(1024, prompt + n);
  cp.n_batch = std::max(512, prompt);
  cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = std::stoi(argv[5]);
  llama_context* ctx = llama_init_from_model(model, cp);
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<llama_token> out;
  const auto prefill = std::chrono::steady_clock::now();
  if (llama_decode(ctx, llama_batch_get_one(ids.data(), static_cast<int>(ids.size()))) != 0)
    return 1;
  llama_token token = argmax(llama_get_logits_ith(ctx, -1), vocab);
  out.push_back(token);
  const double prefill_seconds = since(prefill);
  const auto decode = std::chrono::steady_clock::now();
  for (int i = 1; i < n; ++i) {
    if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) return 1;
    token = argmax(llama_get_logits_ith(ctx, -1), vocab);
    out.push_back(token);
  }
  const double decode_seconds = since(decode);
  std::printf(
      "{\"load_seconds\": %.4f, \"prefill_tokens_per_second\": %.2f, "
      "\"decode_tokens_per_second\": %.2f, \"ids\": [",
      load_seconds, static_cast<double>(ids.size()) / prefill_seconds, (n - 1) / decode_seconds);
  for (std::size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i > 0 ? ", " : "", out[i]);
  std::printf("]}\n");
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
