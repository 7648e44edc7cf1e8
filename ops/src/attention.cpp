#include "numesh/ops/attention.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/gemm.hpp"
#include "numesh/ops/tensor.hpp"
#include "lowering_util.hpp"
#include "numesh/sharding/corrected_sharding.hpp"

namespace numesh::ops {

void rope_inplace(float* x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d,
                  std::int64_t first_position, float theta) {
  const std::int64_t half = d / 2;
  for (std::int64_t bi = 0; bi < b; ++bi) {
    for (std::int64_t ti = 0; ti < t; ++ti) {
      const auto position = static_cast<double>(first_position + ti);
      for (std::int64_t i = 0; i < half; ++i) {
        // Angles in double: positions times frequencies lose digits in fp32 at long contexts.
        const double freq = std::pow(static_cast<double>(theta),
                                     -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const auto c = static_cast<float>(std::cos(position * freq));
        const auto sn = static_cast<float>(std::sin(position * freq));
        for (std::int64_t hi = 0; hi < h; ++hi) {
          float* row = x + ((bi * t + ti) * h + hi) * d;
          const float x1 = row[i], x2 = row[i + half];
          row[i] = x1 * c - x2 * sn;
          row[i + half] = x2 * c + x1 * sn;
        }
      }
    }
  }
}

void attention_kernel(float* q, float* k, const float* v, float* out, const AttentionSlice& sl,
                      const AttentionConfig& config, std::span<float> scores) {
  const std::int64_t d = config.head_dim;
  if (config.rope_theta > 0.0f) {
    rope_inplace(q, sl.batch, sl.q_len, sl.q_heads, d, config.q_offset, config.rope_theta);
    rope_inplace(k, sl.batch, sl.kv_len, sl.kv_heads, d, 0, config.rope_theta);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t bi = 0; bi < sl.batch; ++bi) {
    for (std::int64_t h = 0; h < sl.q_heads; ++h) {
      const std::int64_t kvh = (sl.q_head_offset + h) / sl.group - sl.kv_head_offset;
      for (std::int64_t ti = 0; ti < sl.q_len; ++ti) {
        const float* qr = q + ((bi * sl.q_len + ti) * sl.q_heads + h) * d;
        const std::int64_t visible = config.causal ? config.q_offset + ti + 1 : sl.kv_len;
        float max_score = -std::numeric_limits<float>::infinity();
        for (std::int64_t si = 0; si < visible; ++si) {
          const float* kr = k + ((bi * sl.kv_len + si) * sl.kv_heads + kvh) * d;
          float dot = 0.0f;
          for (std::int64_t i = 0; i < d; ++i) dot += qr[i] * kr[i];
          scores[static_cast<std::size_t>(si)] = dot * scale;
          max_score = std::max(max_score, dot * scale);
        }
        // The stable softmax: subtract the row maximum before exponentiating.
        float sum = 0.0f;
        for (std::int64_t si = 0; si < visible; ++si) {
          float& e = scores[static_cast<std::size_t>(si)];
          e = std::exp(e - max_score);
          sum += e;
        }
        float* orow = out + ((bi * sl.q_len + ti) * sl.q_heads + h) * d;
        std::fill(orow, orow + d, 0.0f);
        for (std::int64_t si = 0; si < visible; ++si) {
          const float p = scores[static_cast<std::size_t>(si)] / sum;
          const float* vr = v + ((bi * sl.kv_len + si) * sl.kv_heads + kvh) * d;
          for (std::int64_t i = 0; i < d; ++i) orow[i] += p * vr[i];
        }
      }
    }
  }
}

namespace {

using sharding::AxisRule;
using sharding::PartitionSpec;

using detail::shape_text;

}  // namespace

ShardedAttention::ShardedAttention(runtime::DeviceMesh mesh, const AttentionConfig& config,
                                   const AttentionWeights& w, std::int64_t batch,
                                   std::int64_t seq_len, AttentionAxes axes)
    : config_(config), batch_(batch), seq_len_(seq_len) {
  const std::int64_t hq = config.num_heads, hkv = config.num_kv_heads, d = config.head_dim;
  NUMESH_CHECK(hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0, ValueError,
               "attention: num_kv_heads {} must divide num_heads {} (both positive, head_dim {})",
               hkv, hq, d);
  NUMESH_CHECK(config.q_offset == 0, ValueError,
               "attention: q_offset {}: the sharded layer runs full sequences (prefill/train); "
               "decoding against a KV cache is not lowered yet",
               config.q_offset);
  NUMESH_CHECK(config.rope_theta <= 0.0f || d % 2 == 0, ShapeError,
               "attention: head_dim {} is odd, RoPE needs it even", d);
  NUMESH_CHECK(batch > 0 && seq_len > 0, ShapeError, "attention: batch {} and seq_len {} must be positive",
               batch, seq_len);
  NUMESH_CHECK(w.wq.shape.size() == 2, ShapeError, "attention: wq {} must be a matrix", shape_text(w.wq));
  hidden_ = w.wq.shape[0];
  NUMESH_CHECK(w.wq.shape == (std::vector<std::int64_t>{hidden_, hq * d}) &&
                   w.wk.shape == (std::vector<std::int64_t>{hidden_, hkv * d}) &&
                   w.wv.shape == w.wk.shape &&
                   w.wo.shape == (std::vector<std::int64_t>{hq * d, hidden_}),
               ShapeError,
               "attention: wq {}, wk {}, wv {}, wo {} do not fit {} heads, {} kv heads, head_dim {} "
               "(expected [H, {}], [H, {}], [H, {}], [{}, H])",
               shape_text(w.wq), shape_text(w.wk), shape_text(w.wv), shape_text(w.wo), hq, hkv, d, hq * d, hkv * d,
               hkv * d, hq * d);

  const sharding::Mesh& m = mesh.mesh();
  // Heads split only at head granularity (a dim check alone would cut heads apart).
  const std::int64_t tp = m.has_axis(axes.heads) ? m.axis_size(axes.heads) : 1;
  const bool split_q = m.has_axis(axes.heads) && hq % tp == 0;
  const bool split_kv = split_q && hkv % tp == 0;
  const AxisRule q_rule = split_q ? AxisRule(axes.heads) : AxisRule();
  const AxisRule kv_rule = split_kv ? AxisRule(axes.heads) : AxisRule();
  local_q_heads_ = split_q ? hq / tp : hq;
  local_kv_heads_ = split_kv ? hkv / tp : hkv;

  const std::vector<std::int64_t> x_shape{batch, seq_len, hidden_};
  x_ = std::make_unique<runtime::ShardedTensor>(
      mesh, x_shape,
      sharding::correct_spec(x_shape, PartitionSpec({detail::entry_over(axes.batch, m), AxisRule(), AxisRule()}), m).spec);
  wq_ = std::make_unique<runtime::ShardedTensor>(mesh, w.wq.shape, PartitionSpec({AxisRule(), q_rule}));
  wk_ = std::make_unique<runtime::ShardedTensor>(mesh, w.wk.shape, PartitionSpec({AxisRule(), kv_rule}));
  wv_ = std::make_unique<runtime::ShardedTensor>(mesh, w.wv.shape, PartitionSpec({AxisRule(), kv_rule}));
  wo_ = std::make_unique<runtime::ShardedTensor>(mesh, w.wo.shape, PartitionSpec({q_rule, AxisRule()}));
  runtime::scatter(w.wq, *wq_);
  runtime::scatter(w.wk, *wk_);
  runtime::scatter(w.wv, *wv_);
  runtime::scatter(w.wo, *wo_);
  y_partial_ = std::make_unique<runtime::ShardedTensor>(mesh, x_shape, x_->spec());
  y_ = std::make_unique<runtime::ShardedTensor>(mesh, x_shape, x_->spec());

  std::vector<sharding::Placement> y_placed = sharding::to_placements(x_->spec(), m, 3);
  if (split_q) {
    y_placed[*m.find_axis(axes.heads)] = sharding::Placement::partial();
  }

  const std::int64_t local_batch = x_->layout().shard_shape()[0];
  const std::int64_t rows = local_batch * seq_len;
  runtime::GraphBuilder b(mesh.device_set());
  runtime::Frontier done(static_cast<std::size_t>(mesh.size()), runtime::kReady);
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    runtime::Device& dev = mesh.device(s);
    q_.emplace_back(dev, std::vector<std::int64_t>{rows, local_q_heads_ * d});
    k_.emplace_back(dev, std::vector<std::int64_t>{rows, local_kv_heads_ * d});
    v_.emplace_back(dev, std::vector<std::int64_t>{rows, local_kv_heads_ * d});
    o_.emplace_back(dev, std::vector<std::int64_t>{rows, local_q_heads_ * d});
    scores_.emplace_back(static_cast<std::size_t>(seq_len), 0.0f);
  }
  for (std::int64_t s = 0; s < mesh.size(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    const int dev = mesh.device(s).index();
    // The slot's rank along the heads axis gives its first global heads.
    const std::int64_t head_rank = split_q ? mesh.coords(s)[*m.find_axis(axes.heads)] : 0;
    const AttentionSlice slice{.batch = local_batch,
                               .q_len = seq_len,
                               .kv_len = seq_len,
                               .q_heads = local_q_heads_,
                               .kv_heads = local_kv_heads_,
                               .group = hq / hkv,
                               .q_head_offset = head_rank * local_q_heads_,
                               .kv_head_offset = split_kv ? head_rank * local_kv_heads_ : 0};
    runtime::Tensor& x = x_->shard(s);
    runtime::Tensor& q = q_[i];
    runtime::Tensor& k = k_[i];
    runtime::Tensor& v = v_[i];
    runtime::Tensor& o = o_[i];
    runtime::Tensor& wq = wq_->shard(s);
    runtime::Tensor& wk = wk_->shard(s);
    runtime::Tensor& wv = wv_->shard(s);
    runtime::Tensor& wo = wo_->shard(s);
    runtime::Tensor& yp = y_partial_->shard(s);
    std::vector<float>& scores = scores_[i];
    const AttentionConfig cfg = config_;
    const auto qkv = b.add(dev, fmt::format("attn.qkv[{}]", s), [&x, &q, &k, &v, &wq, &wk, &wv, rows, this] {
      const ConstMatrixMap xm(x.values().data(), rows, hidden_);
      gemm(xm, as_matrix(std::as_const(wq)), as_matrix(q));
      gemm(xm, as_matrix(std::as_const(wk)), as_matrix(k));
      gemm(xm, as_matrix(std::as_const(wv)), as_matrix(v));
    });
    const auto core = b.add(dev, fmt::format("attn.core[{}]", s), [&q, &k, &v, &o, &scores, slice, cfg] {
      attention_kernel(q.values().data(), k.values().data(), v.values().data(), o.values().data(),
                       slice, cfg, scores);
    }, {qkv});
    done[i] = b.add(dev, fmt::format("attn.out[{}]", s), [&o, &wo, &yp, rows, this] {
      gemm(as_matrix(std::as_const(o)), as_matrix(std::as_const(wo)),
           MatrixMap(yp.values().data(), rows, hidden_));
    }, {core});
  }
  reshard_ = reshard(b, *y_partial_, y_placed, *y_, sharding::to_placements(y_->spec(), m, 3), done,
                     "attn.out");
  graph_ = std::make_unique<runtime::CompiledGraph>(b.compile());
}

runtime::HostTensor ShardedAttention::forward(const runtime::HostTensor& x) {
  NUMESH_CHECK(x.shape == (std::vector<std::int64_t>{batch_, seq_len_, hidden_}), ShapeError,
               "attention: input is {} but the layer was compiled for [{}, {}, {}]", shape_text(x),
               batch_, seq_len_, hidden_);
  runtime::scatter(x, *x_);
  graph_->run();
  return runtime::gather(*y_);
}

}  // namespace numesh::ops
