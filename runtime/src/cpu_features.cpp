#include "numesh/runtime/cpu_features.hpp"

#include <cpuid.h>
#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>

#include "numesh/core/log.hpp"

namespace numesh::runtime {

std::string CpuFeatures::text() const {
  std::string out;
  auto add = [&](bool has, std::string_view name) {
    if (!has) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_vnni, "avx512_vnni");
  add(amx, "amx");
  return out.empty() ? std::string("none of avx2/avx512") : out;
}

std::string_view to_string(KernelLevel level) noexcept {
  switch (level) {
    case KernelLevel::kScalar:
      return "scalar";
    case KernelLevel::kAvx2:
      return "avx2";
    case KernelLevel::kAvx512:
      return "avx512";
    case KernelLevel::kAvx512Bf16:
      return "avx512-bf16";
    case KernelLevel::kAmx:
      return "amx";
  }
  return "?";
}

namespace {

// AMX-TILE, -INT8 and -BF16 are CPUID leaf 7, sub-leaf 0, EDX bits 24, 25 and 22; their state
// (XCR0 bits 17 and 18, XTILECFG and XTILEDATA) must be enabled by the OS, and Linux hands the
// 8 KiB XTILEDATA state to a process only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM, 0x1023,
// for feature 18): until then a tile instruction faults. The permission is the process's, so
// every thread, the oneTBB workers included, may then use the tiles.
bool amx_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  constexpr unsigned kTile = 1U << 24, kInt8 = 1U << 25, kBf16 = 1U << 22;
  if ((edx & (kTile | kInt8 | kBf16)) != (kTile | kInt8 | kBf16)) return false;
  // XGETBV needs OSXSAVE (CPUID leaf 1, ECX bit 27).
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1U << 27)) == 0) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  constexpr unsigned kTileState = (1U << 17) | (1U << 18);
  if ((xcr0_low & kTileState) != kTileState) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

const CpuFeatures& cpu_features() noexcept {
  static const CpuFeatures features = [] {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2 = __builtin_cpu_supports("avx2") != 0;
    f.fma = __builtin_cpu_supports("fma") != 0;
    // F16C is CPUID leaf 1, ECX bit 29, read directly as AVX512_BF16 is below: clang 14's
    // __builtin_cpu_supports knows neither. Its OS support is AVX's, which avx2 needs too.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    f.f16c = f.avx2 && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1U << 29)) != 0;
    f.avx512f = __builtin_cpu_supports("avx512f") != 0;
    f.avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    f.avx512vl = __builtin_cpu_supports("avx512vl") != 0;
    // AVX512_BF16 is CPUID leaf 7, sub-leaf 1, EAX bit 5. Its registers' OS support is
    // AVX-512's, which the avx512f check covers.
    f.avx512_bf16 =
        f.avx512f && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1U << 5)) != 0;
    // AVX512_VNNI is CPUID leaf 7, sub-leaf 0, ECX bit 11.
    f.avx512_vnni = f.avx512f && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 &&
                    (ecx & (1U << 11)) != 0;
    f.amx = f.avx512f && amx_usable();
    return f;
  }();
  return features;
}

KernelLevel widest_kernel_level(const CpuFeatures& f) noexcept {
  if (!(f.avx2 && f.fma && f.f16c)) return KernelLevel::kScalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl)) return KernelLevel::kAvx2;
  if (!(f.avx512_bf16 && f.avx512_vnni)) return KernelLevel::kAvx512;
  return f.amx ? KernelLevel::kAmx : KernelLevel::kAvx512Bf16;
}

std::vector<KernelLevel> runnable_kernel_levels() {
  std::vector<KernelLevel> levels;
  const KernelLevel widest = widest_kernel_level(cpu_features());
  for (KernelLevel l : {KernelLevel::kScalar, KernelLevel::kAvx2, KernelLevel::kAvx512,
                        KernelLevel::kAvx512Bf16, KernelLevel::kAmx}) {
    if (static_cast<int>(l) <= static_cast<int>(widest)) levels.push_back(l);
  }
  return levels;
}

KernelLevel kernel_level() noexcept {
  static const KernelLevel level = [] {
    const KernelLevel widest = widest_kernel_level(cpu_features());
    const char* env = std::getenv("NUMESH_KERNELS");
    if (env == nullptr || *env == '\0') return widest;
    for (KernelLevel l : runnable_kernel_levels()) {
      if (to_string(l) == env) return l;
    }
    log::warn("NUMESH_KERNELS={} is not a kernel level this CPU runs ({}); using {}", env,
              cpu_features().text(), to_string(widest));
    return widest;
  }();
  return level;
}

}  // namespace numesh::runtime
