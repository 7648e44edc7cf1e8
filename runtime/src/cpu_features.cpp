#include "numesh/runtime/cpu_features.hpp"

#include <cpuid.h>
#include <fmt/format.h>

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
  }
  return "?";
}

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
    return f;
  }();
  return features;
}

KernelLevel widest_kernel_level(const CpuFeatures& f) noexcept {
  if (!(f.avx2 && f.fma && f.f16c)) return KernelLevel::kScalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl)) return KernelLevel::kAvx2;
  return f.avx512_bf16 && f.avx512_vnni ? KernelLevel::kAvx512Bf16 : KernelLevel::kAvx512;
}

std::vector<KernelLevel> runnable_kernel_levels() {
  std::vector<KernelLevel> levels;
  const KernelLevel widest = widest_kernel_level(cpu_features());
  for (KernelLevel l :
       {KernelLevel::kScalar, KernelLevel::kAvx2, KernelLevel::kAvx512, KernelLevel::kAvx512Bf16}) {
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
