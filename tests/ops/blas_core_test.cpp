#include "numesh/ops/kernels/blas_core.hpp"

#include <gtest/gtest.h>

#include "numesh/runtime/cpu_features.hpp"

namespace numesh::ops {
namespace {

runtime::CpuFeatures avx2_cpu() {
  runtime::CpuFeatures f;
  f.avx2 = f.fma = f.f16c = true;
  return f;
}

runtime::CpuFeatures avx512_cpu() {
  runtime::CpuFeatures f = avx2_cpu();
  f.avx512f = f.avx512bw = f.avx512vl = true;
  return f;
}

// The cores OpenBLAS gives CPUs it does not know are replaced by the CPU's class; the cores
// whose kernels use AVX2 or AVX-512 are kept, Zen's on an AVX-512 Zen 4 too.
TEST(BlasCoreTest, AnOlderCoreThanTheCpuIsReplacedByItsClass) {
  EXPECT_EQ(blas_core_to_request("Prescott", avx512_cpu()), "SkylakeX");
  EXPECT_EQ(blas_core_to_request("Sandybridge", avx512_cpu()), "SkylakeX");
  EXPECT_EQ(blas_core_to_request("Prescott", avx2_cpu()), "Haswell");
  EXPECT_EQ(blas_core_to_request("Nehalem", avx2_cpu()), "Haswell");
  EXPECT_EQ(blas_core_to_request("", avx2_cpu()), "Haswell");
  for (const char* wide : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(blas_core_to_request(wide, avx512_cpu()), "") << wide;
    EXPECT_EQ(blas_core_to_request(wide, avx2_cpu()), "") << wide;
  }
  runtime::CpuFeatures no_fma = avx2_cpu();
  no_fma.fma = false;
  EXPECT_EQ(blas_core_to_request("Prescott", no_fma), "") << "AVX2 without FMA";
  EXPECT_EQ(blas_core_to_request("Prescott", runtime::CpuFeatures{}), "") << "no AVX2";
}

TEST(BlasCoreTest, TheLoadedOpenBlasNamesItsCore) { EXPECT_FALSE(blas_core().empty()); }

}  // namespace
}  // namespace numesh::ops
