#pragma once

// The check `numesh run` and `numesh op` make of their outputs against the dense reference.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "numesh/ops/compare.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::tools {

/// The check's bound with weights in a block format (q8_0, q4_0): each projection's input is
/// quantized to 8 bits a block, by the kernels from fp32 and by the reference from float64, and
/// a value next to a code boundary takes the neighbouring code (a step of max|x| / 127), which
/// moves more than a bf16 rounding does. Measured on `numesh run --moe-every 0`'s default dense
/// model: q8_0 1.24e-2, q4_0 1.15e-2.
inline constexpr double kBlockFormatCheckBound = 4e-2;

/// The outputs of one run compared with the dense reference, part by part ("prefill",
/// "decode step 3", ...). The run fails when any part has an element that is non-finite in one
/// and not the other, a reference that is not finite (the inputs hold NaN or infinities, or the
/// model overflows: nothing to vouch for), or a relative error above the bound.
class ReferenceCheck {
 public:
  /// REQUIRES: bound >= 0.
  explicit ReferenceCheck(double bound) : bound_(bound) {}

  /// Compares `got` with `want` as the part `what`. Throws: ShapeError when the shapes differ.
  void add(const std::string& what, const runtime::HostTensor& got,
           const runtime::HostTensor& want);
  /// True when every part passed (and at least one was added).
  [[nodiscard]] bool ok() const noexcept { return parts_ > 0 && failure_.empty(); }
  /// The largest relative error of the parts whose elements are all finite in both.
  [[nodiscard]] double worst_relative_error() const noexcept { return worst_; }
  /// The relative error of the parts added under `what` (the largest; -1 when none).
  [[nodiscard]] double relative_error(const std::string& what) const;
  /// relative_error(what) as "4.14e-07", or "n/a" when a non-finite value left it unmeasured.
  [[nodiscard]] std::string error_text(const std::string& what) const;
  /// "ok", or what failed first: the part and ops::Comparison::describe().
  [[nodiscard]] std::string verdict() const;
  /// The bound.
  [[nodiscard]] double bound() const noexcept { return bound_; }
  /// {"ok", "bound", "worst_relative_error", "failure" (when failed)}.
  [[nodiscard]] nlohmann::json to_json() const;

 private:
  double bound_;
  double worst_ = 0.0;
  std::int64_t parts_ = 0;
  std::vector<std::pair<std::string, double>> errors_;
  std::string failure_;
};

}  // namespace numesh::tools
