// Writes a GGUF file with llama.cpp's own quantizer, as llama-quantize does without an
// importance matrix: quantize IN.gguf OUT.gguf FTYPE (llama_ftype's number: 12 Q3_K_M, 15 Q4_K_M,
// 17 Q5_K_M). bench/llama_cpp/run.sh builds it against the package's libllama for its
// llama-q*_k_m types: a mixture as llama.cpp's users get it, read by both engines.
#include <cstdio>
#include <cstdlib>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: quantize IN.gguf OUT.gguf FTYPE\n");
    return 2;
  }
  llama_backend_init();
  llama_model_quantize_params params = llama_model_quantize_default_params();
  params.ftype = static_cast<llama_ftype>(std::atoi(argv[3]));
  params.nthread = 2;
  const unsigned failed = llama_model_quantize(argv[1], argv[2], &params);
  llama_backend_free();
  return failed == 0 ? 0 : 1;
}
