#include "numesh/ops/attention_config.hpp"

#include <fmt/format.h>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "shape_text.hpp"

namespace numesh::ops {

std::string to_string(const AttentionFormats& formats) {
  if (formats.all_are(formats.wq)) return std::string(to_string(formats.wq));
  return fmt::format("wq {}, wk {}, wv {}, wo {}", to_string(formats.wq), to_string(formats.wk),
                     to_string(formats.wv), to_string(formats.wo));
}

void check_biases_and_norms(const AttentionWeights& w, const AttentionConfig& c,
                            std::int64_t hidden) {
  const std::int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const struct {
    const char* name;
    const runtime::HostTensor& t;
    std::int64_t size;
    const char* what;
  } expected[] = {
      {"bq", w.bq, q, "num_heads * head_dim"},      {"bk", w.bk, kv, "num_kv_heads * head_dim"},
      {"bv", w.bv, kv, "num_kv_heads * head_dim"},  {"bo", w.bo, hidden, "hidden"},
      {"q_norm", w.q_norm, c.head_dim, "head_dim"}, {"k_norm", w.k_norm, c.head_dim, "head_dim"}};
  for (const auto& e : expected) {
    NUMESH_CHECK(e.t.shape.empty() || e.t.shape == std::vector<std::int64_t>{e.size}, ShapeError,
                 "attention: {} {} must be [{}] ({}) or empty", e.name, detail::shape_text(e.t),
                 e.size, e.what);
  }
}

KvLayout parse_kv_layout(std::string_view text, OptionStyle style) {
  NUMESH_CHECK(text == "bthd" || text == "bhtd", ValueError, "{}: expected bthd or bhtd",
               option_text(style, "kv_layout", fmt::format("'{}'", text)));
  return text == "bthd" ? KvLayout::kBTHD : KvLayout::kBHTD;
}

}  // namespace numesh::ops
