#pragma once

#include <string>
#include <string_view>

#include "numesh/runtime/cpu_features.hpp"

// Which of its kernels OpenBLAS runs. A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels once,
// when it loads, from a table of CPU models; a model newer than its table may get its oldest
// x86-64 kernels. Debian 12's OpenBLAS 0.3.21 gives an Emerald Rapids (family 6, model 207) its
// Prescott (SSE3) kernels: fp32 products ran at a quarter to a sixth of the SkylakeX kernels'
// speed there (docs/benchmarks.md, "OpenBLAS's kernels on a CPU it does not know"). The
// environment variable OPENBLAS_CORETYPE, read when the library loads, names the core instead;
// the numesh program sets it and starts again when OpenBLAS chose an older core than the CPU's
// (tools/numesh/main.cpp). A program that embeds numesh sets it itself.

namespace numesh::ops {

/// The core OpenBLAS runs ("Haswell", "SkylakeX", "Cooperlake", "Zen", "Prescott", ...): its
/// openblas_get_corename().
[[nodiscard]] std::string blas_core();

/// The threads OpenBLAS's own products may use (openblas_get_num_threads()): the cores, or
/// OPENBLAS_NUM_THREADS when it was set as the library loaded (the numesh program sets 1: its
/// pool's threads spin at start, tools/numesh/main.cpp), until numesh's first product sets 1.
[[nodiscard]] int blas_threads();

/// The core to name in OPENBLAS_CORETYPE when OpenBLAS chose `chosen` on a CPU with `cpu`'s
/// features: "SkylakeX" when the CPU has AVX-512 (F, BW, VL) and "Haswell" when it has AVX2 and
/// FMA, if `chosen` is not a core of that class or wider ("Haswell", "Zen", "SkylakeX",
/// "Cooperlake", "SapphireRapids"); empty when OpenBLAS's choice already uses the CPU's
/// vectors (a Zen 4 keeps its "Zen": numesh's figures there were measured with it) or the CPU
/// has neither.
[[nodiscard]] std::string blas_core_to_request(std::string_view chosen,
                                               const runtime::CpuFeatures& cpu);

}  // namespace numesh::ops
