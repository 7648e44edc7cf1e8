#pragma once

// Tests of a kernel at each of its levels. A level-dependent test is a TEST_P of a fixture
// derived from KernelLevelTest, instantiated over every level with NUMESH_INSTANTIATE_LEVELS:
// one CTest test per level, named by it (".../avx512_bf16"). A level this CPU cannot run is a
// GTEST_SKIP naming the level, so CTest's summary counts it as skipped, never as passed; the
// levels it can run are all run, whatever NUMESH_KERNELS says (that variable picks the level of
// the kernels that dispatch by themselves, which scripts/test.sh forces in turn).

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "numesh/runtime/cpu_features.hpp"

namespace numesh::runtime {

/// GoogleTest prints a level by its name ("avx512-bf16"), not as bytes.
inline void PrintTo(KernelLevel level, std::ostream* out) { *out << to_string(level); }

}  // namespace numesh::runtime

namespace numesh::testing {

/// Every kernel level numesh has, scalar first, runnable here or not.
inline std::vector<runtime::KernelLevel> all_kernel_levels() {
  return {runtime::KernelLevel::kScalar, runtime::KernelLevel::kAvx2, runtime::KernelLevel::kAvx512,
          runtime::KernelLevel::kAvx512Bf16, runtime::KernelLevel::kAmx};
}

/// True when this CPU runs `level`.
inline bool runs_here(runtime::KernelLevel level) {
  const std::vector<runtime::KernelLevel> levels = runtime::runnable_kernel_levels();
  return std::find(levels.begin(), levels.end(), level) != levels.end();
}

/// The level as a test-name suffix: "scalar", "avx2", "avx512", "avx512_bf16", "amx".
inline std::string level_test_name(const ::testing::TestParamInfo<runtime::KernelLevel>& info) {
  std::string name(runtime::to_string(info.param));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

/// A fixture whose parameter is the kernel level under test; skips, naming the level and this
/// CPU's features, when the CPU cannot run it.
class KernelLevelTest : public ::testing::TestWithParam<runtime::KernelLevel> {
 protected:
  void SetUp() override {
    if (!runs_here(level())) {
      GTEST_SKIP() << "kernel level " << runtime::to_string(level())
                   << ": this CPU cannot run it (it has " << runtime::cpu_features().text() << ")";
    }
  }
  /// The level under test.
  [[nodiscard]] runtime::KernelLevel level() const { return GetParam(); }
};

}  // namespace numesh::testing

/// Instantiates the TEST_Ps of `fixture` (a KernelLevelTest) once per kernel level.
#define NUMESH_INSTANTIATE_LEVELS(fixture)                                              \
  INSTANTIATE_TEST_SUITE_P(Level, fixture,                                              \
                           ::testing::ValuesIn(::numesh::testing::all_kernel_levels()), \
                           ::numesh::testing::level_test_name)
