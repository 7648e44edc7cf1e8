#include "numesh/ops/mlp_config.hpp"

#include <fmt/format.h>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "shape_text.hpp"

namespace numesh::ops {

std::string to_string(const MlpFormats& formats) {
  if (formats.all_are(formats.up)) return std::string(to_string(formats.up));
  return fmt::format("gate {}, up {}, down {}", to_string(formats.gate), to_string(formats.up),
                     to_string(formats.down));
}

void check_biases(const MlpWeights& w, MlpKind kind, std::int64_t hidden,
                  std::int64_t intermediate) {
  NUMESH_CHECK(mlp_traits(kind).gated || w.gate_bias.shape.empty(), ShapeError,
               "mlp ({}): gate_bias {} given, but a {} MLP has no gate", to_string(kind),
               detail::shape_text(w.gate_bias), to_string(kind));
  const struct {
    const char* name;
    const runtime::HostTensor& t;
    std::int64_t size;
    const char* what;
  } expected[] = {{"gate_bias", w.gate_bias, intermediate, "intermediate"},
                  {"up_bias", w.up_bias, intermediate, "intermediate"},
                  {"down_bias", w.down_bias, hidden, "hidden"}};
  for (const auto& e : expected) {
    NUMESH_CHECK(e.t.shape.empty() || e.t.shape == std::vector<std::int64_t>{e.size}, ShapeError,
                 "mlp ({}): {} {} must be [{}] ({}) or empty", to_string(kind), e.name,
                 detail::shape_text(e.t), e.size, e.what);
  }
}

}  // namespace numesh::ops
