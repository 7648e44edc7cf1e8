#pragma once

#include <cstdlib>
#include <string_view>

#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/runtime/weight_panels.hpp"

namespace numesh::ops {

/// Whether matrices of `dtype` stored in panels of 16 outputs (runtime/weight_panels.hpp) are
/// multiplied faster than rows at `level`: the format's prefill tile reads its panels where they
/// lie at least as fast as its dot kernel reads rows at one row, and faster at more, so that
/// device_gemm takes the tile for every number of rows there (q8_0 and q4_0 from avx2:
/// docs/ops.md, "Weights in panels"); false for formats without panels.
bool panels_pay(DType dtype, runtime::KernelLevel level) noexcept;

/// How the layers store an out-in weight matrix of `dtype` (laid_out_out_in): in panels where
/// they pay at the process's kernel level (panels_pay), rows elsewhere (where they do not pay,
/// the dot kernels read panels only by restoring their rows, block_gemm.hpp). The environment
/// variable NUMESH_WEIGHT_PANELS (read once) overrides it: 0 keeps rows everywhere (to compare
/// the two), 1 takes panels at every level (the tests' way to run the lower levels on them).
/// Where panels do not pay either order gives the same bits; where they do, products on panels
/// take the tile's order at every row count and rows the dot kernels' (docs/ops.md), which round
/// the same quantized sums differently. CausalLm's load in place (`--mmap on`) keeps a file's
/// rows where this says panels (models/src/shard_reader.hpp).
inline runtime::StoredOrder out_in_order(DType dtype) {
  enum class Choice { kAuto, kNever, kAlways };
  static const Choice choice = [] {
    const char* v = std::getenv("NUMESH_WEIGHT_PANELS");
    if (v == nullptr) return Choice::kAuto;
    return std::string_view(v) == "0"   ? Choice::kNever
           : std::string_view(v) == "1" ? Choice::kAlways
                                        : Choice::kAuto;
  }();
  bool panels = false;
  switch (choice) {
    case Choice::kAuto:
      panels = panels_pay(dtype, runtime::kernel_level());
      break;
    case Choice::kNever:
      break;
    case Choice::kAlways:
      panels = true;
      break;
  }
  return panels && runtime::has_panels(dtype) ? runtime::StoredOrder::kPanels
                                              : runtime::StoredOrder::kRows;
}

}  // namespace numesh::ops
