#include "numesh/ops/kernels/blas_core.hpp"

#include <algorithm>
#include <array>

extern "C" char* openblas_get_corename(void);
extern "C" int openblas_get_num_threads(void);

namespace numesh::ops {

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string();
}

int blas_threads() { return openblas_get_num_threads(); }

std::string blas_core_to_request(std::string_view chosen, const runtime::CpuFeatures& cpu) {
  // OpenBLAS's own names of the cores whose kernels use AVX2 and FMA or AVX-512.
  constexpr std::array<std::string_view, 5> kWide = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                                     "SapphireRapids"};
  if (std::find(kWide.begin(), kWide.end(), chosen) != kWide.end()) return {};
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return "Haswell";
  return {};
}

}  // namespace numesh::ops
