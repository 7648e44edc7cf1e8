#include "reference_check.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace numesh::tools {

void ReferenceCheck::add(const std::string& what, const runtime::HostTensor& got,
                         const runtime::HostTensor& want) {
  const ops::Comparison c = ops::compare(got, want);
  ++parts_;
  double err = -1.0;
  if (c.nonfinite_mismatches == 0 && c.is_finite_reference()) err = c.relative_error;
  auto it =
      std::find_if(errors_.begin(), errors_.end(), [&](const auto& e) { return e.first == what; });
  if (it == errors_.end()) {
    errors_.emplace_back(what, err);
  } else if (err < 0 || (it->second >= 0 && err > it->second)) {
    it->second = err;
  }
  if (err >= 0) worst_ = std::max(worst_, err);
  if (!failure_.empty()) return;
  if (c.nonfinite_mismatches > 0) {
    failure_ = fmt::format("{}: {}", what, c.describe());
  } else if (!c.is_finite_reference()) {
    failure_ = fmt::format(
        "{}: the dense reference is not finite ({} of {} elements, the first at {}): the inputs "
        "hold NaN or infinities, or the model overflows",
        what, c.nonfinite_reference, c.elements, c.index_text(c.first_nonfinite_reference));
  } else if (!c.within(bound_)) {
    failure_ = fmt::format("{}: {} is above the bound {:.0e}", what, c.describe(), bound_);
  }
}

double ReferenceCheck::relative_error(const std::string& what) const {
  auto it =
      std::find_if(errors_.begin(), errors_.end(), [&](const auto& e) { return e.first == what; });
  return it == errors_.end() ? -1.0 : it->second;
}

std::string ReferenceCheck::error_text(const std::string& what) const {
  const double e = relative_error(what);
  return e < 0 ? "n/a" : fmt::format("{:.2e}", e);
}

std::string ReferenceCheck::verdict() const {
  if (parts_ == 0) return "FAILED: nothing was compared";
  return failure_.empty() ? "ok" : "FAILED: " + failure_;
}

nlohmann::json ReferenceCheck::to_json() const {
  nlohmann::json j{{"ok", ok()}, {"bound", bound_}, {"worst_relative_error", worst_}};
  if (!ok()) j["failure"] = verdict();
  return j;
}

}  // namespace numesh::tools
