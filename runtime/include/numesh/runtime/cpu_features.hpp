#pragma once

#include <string>
#include <string_view>
#include <vector>

// What this CPU can run, read once at run time, and the kernel level numesh's dtype-aware
// kernels choose from it. The binary may be built for a wider instruction set than some machines
// it runs on (NUMESH_NATIVE=OFF packages), so kernels that use AVX2 or AVX-512 are compiled
// for their level and picked here, never assumed.

namespace numesh::runtime {

/// The instruction-set extensions numesh's kernels use, as the CPU and the OS report them
/// (the OS must save the wide registers: GCC's __builtin_cpu_supports checks XCR0 too).
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;  ///< vcvtph2ps / vcvtps2ph: f16 <-> f32
  bool avx512f = false;
  bool avx512bw = false;  ///< 16-bit lanes in 512-bit vectors
  bool avx512vl = false;
  bool avx512_bf16 = false;  ///< vdpbf16ps, vcvtne2ps2bf16
  bool avx512_vnni = false;  ///< vpdpbusd: int8 dot products into int32
  /// AMX-TILE, AMX-INT8 and AMX-BF16 (tdpbssd, tdpbf16ps: 16 x 16 tiles of int32 or f32 sums),
  /// usable only once the OS grants the process the tile data state (Linux 5.16+: asked for
  /// once, by cpu_features(), with arch_prctl(ARCH_REQ_XCOMP_PERM)); false when it refused.
  bool amx = false;

  /// The names of the extensions present, in the order above ("avx2 fma f16c avx512f ...").
  [[nodiscard]] std::string text() const;
};

/// The kernel levels, widest last. Each kernel has a scalar version and may have versions for
/// the wider levels; the dispatcher runs the widest the CPU supports. Each level holds every
/// extension of the levels before it, so a kernel asks `level >= KernelLevel::kAvx512` for
/// "AVX-512 or wider", never `==`.
enum class KernelLevel {
  kScalar,      ///< portable C++
  kAvx2,        ///< AVX2 + FMA + F16C
  kAvx512,      ///< AVX-512 F/BW/VL (+ the AVX2 requirements)
  kAvx512Bf16,  ///< AVX-512 BF16 and VNNI on top of kAvx512 (every CPU with BF16 has VNNI:
                ///< Cooper Lake, Sapphire Rapids and later, Zen 4 and later)
  kAmx,         ///< AMX tiles (INT8 and BF16) on top of kAvx512Bf16: Sapphire Rapids and later
};

/// "scalar", "avx2", "avx512", "avx512-bf16" or "amx".
[[nodiscard]] std::string_view to_string(KernelLevel level) noexcept;

/// This CPU's features (read once; thread-safe). The first call asks the OS for the AMX tile
/// state when the CPU has AMX (a process-wide permission, which every thread then holds).
[[nodiscard]] const CpuFeatures& cpu_features() noexcept;

/// The widest level `features` supports.
[[nodiscard]] KernelLevel widest_kernel_level(const CpuFeatures& features) noexcept;

/// The levels up to the widest this CPU supports, scalar first: every path a test can run here.
[[nodiscard]] std::vector<KernelLevel> runnable_kernel_levels();

/// The level numesh's kernels use: the widest this CPU supports, or a narrower one chosen with
/// the environment variable NUMESH_KERNELS=scalar|avx2|avx512|avx512-bf16|amx (read once; a level
/// the CPU cannot run, or an unknown name, falls back to the widest with a warning on stderr).
[[nodiscard]] KernelLevel kernel_level() noexcept;

}  // namespace numesh::runtime
