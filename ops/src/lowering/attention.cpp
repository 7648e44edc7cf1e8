#include "numesh/ops/lowering/attention.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/kernels/attention_core.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/ops/kernels/norms.hpp"
#include "numesh/ops/kernels/paged_attention.hpp"
#include "numesh/ops/kernels/rope.hpp"
#include "numesh/ops/lowering/gradients.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/sharding/corrected_sharding.hpp"

namespace numesh::ops {

namespace {

using sharding::AxisRule;
using sharding::PartitionSpec;

using detail::add_bias_rows;
using detail::shape_text;

// Calls f(first, count, position) for each run of consecutive sequences [first, first + count)
// of the `count` local ones starting at global sequence `offset` that stand at the same
// position: one run of all of them when positions is null (full sequences from 0) or when
// they are all level, so that equal positions keep the batched kernels.
template <typename F>
void for_each_run(const std::vector<std::int64_t>* positions, std::int64_t offset,
                  std::int64_t count, F&& f) {
  if (positions == nullptr) {
    f(std::int64_t{0}, count, std::int64_t{0});
    return;
  }
  NUMESH_CHECK(static_cast<std::int64_t>(positions->size()) >= offset + count, ShapeError,
               "attention: {} positions given for sequences [{}, {})", positions->size(), offset,
               offset + count);
  const auto at = [&](std::int64_t b) {
    return (*positions)[static_cast<std::size_t>(offset + b)];
  };
  for (std::int64_t b = 0; b < count;) {
    std::int64_t e = b + 1;
    while (e < count && at(e) == at(b)) ++e;
    f(b, e - b, at(b));
    b = e;
  }
}

}  // namespace

AttentionLayer AttentionLayer::create(const runtime::DeviceMesh& mesh,
                                      const AttentionConfig& config, const AttentionWeights& w,
                                      const AttentionAxes& axes) {
  const std::int64_t hq = config.num_heads, hkv = config.num_kv_heads, d = config.head_dim;
  NUMESH_CHECK(hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0, ValueError,
               "attention: num_kv_heads {} must divide num_heads {} (both positive, head_dim {})",
               hkv, hq, d);
  NUMESH_CHECK(config.q_offset == 0, ValueError,
               "attention: q_offset {}: a lowered layer takes positions per run (forward's "
               "position argument), so config.q_offset must be 0",
               config.q_offset);
  NUMESH_CHECK(std::isfinite(config.rope_theta), ValueError,
               "attention: rope_theta {} is not finite", config.rope_theta);
  NUMESH_CHECK(config.rope_theta <= 0.0f || d % 2 == 0, ShapeError,
               "attention: head_dim {} is odd, RoPE needs it even", d);
  validate(config.rope_scaling);
  NUMESH_CHECK(w.wq.shape.size() == 2, ShapeError, "attention: wq {} must be a matrix",
               shape_text(w.wq));
  AttentionLayer layer;
  layer.config = config;
  layer.hidden = w.wq.shape[0];
  const std::int64_t hidden = layer.hidden;
  NUMESH_CHECK(hidden > 0, ShapeError,
               "attention: wq {} has no rows; the hidden size must be positive", shape_text(w.wq));
  NUMESH_CHECK(
      w.wq.shape == (std::vector<std::int64_t>{hidden, hq * d}) &&
          w.wk.shape == (std::vector<std::int64_t>{hidden, hkv * d}) && w.wv.shape == w.wk.shape &&
          w.wo.shape == (std::vector<std::int64_t>{hq * d, hidden}),
      ShapeError,
      "attention: wq {}, wk {}, wv {}, wo {} do not fit {} heads, {} kv heads, head_dim {} "
      "(expected [H, {}], [H, {}], [H, {}], [{}, H])",
      shape_text(w.wq), shape_text(w.wk), shape_text(w.wv), shape_text(w.wo), hq, hkv, d, hq * d,
      hkv * d, hkv * d, hq * d);

  const sharding::Mesh& m = mesh.mesh();
  // Heads split only at head granularity (a dim check alone would cut heads apart).
  const std::int64_t tp = m.has_axis(axes.heads) ? m.axis_size(axes.heads) : 1;
  const bool split_q = m.has_axis(axes.heads) && tp > 1 && hq % tp == 0;
  const bool split_kv = split_q && hkv % tp == 0;
  if (split_q) layer.heads_axis = axes.heads;
  const AxisRule q_rule = split_q ? AxisRule(axes.heads) : AxisRule();
  const AxisRule kv_rule = split_kv ? AxisRule(axes.heads) : AxisRule();
  layer.local_q_heads = split_q ? hq / tp : hq;
  layer.local_kv_heads = split_kv ? hkv / tp : hkv;
  // Stored out-in ([out, in]): decode reads each output's weights in one run.
  layer.wq =
      detail::laid_out_out_in(mesh, w.wq, PartitionSpec({AxisRule(), q_rule}), w.stored_as.wq);
  layer.wk =
      detail::laid_out_out_in(mesh, w.wk, PartitionSpec({AxisRule(), kv_rule}), w.stored_as.wk);
  layer.wv =
      detail::laid_out_out_in(mesh, w.wv, PartitionSpec({AxisRule(), kv_rule}), w.stored_as.wv);
  layer.wo =
      detail::laid_out_out_in(mesh, w.wo, PartitionSpec({q_rule, AxisRule()}), w.stored_as.wo);
  check_biases_and_norms(w, config, hidden);
  // Each a row [1, n] split as the outputs it is added to (a few KiB).
  layer.bq = detail::laid_out_row(mesh, w.bq, q_rule);
  layer.bk = detail::laid_out_row(mesh, w.bk, kv_rule);
  layer.bv = detail::laid_out_row(mesh, w.bv, kv_rule);
  layer.bo = detail::laid_out_row(mesh, w.bo, AxisRule());
  layer.q_norm = detail::laid_out_row(mesh, w.q_norm, AxisRule());
  layer.k_norm = detail::laid_out_row(mesh, w.k_norm, AxisRule());
  return layer;
}

namespace {

// Element `at` on of a cache shard set to the d values at src, narrowed to the shard's dtype
// (bf16 and f16 round to nearest even).
void store_cache_row(runtime::Tensor& cache, std::int64_t at, const float* src, std::int64_t d) {
  if (cache.dtype() == DType::kF32) {
    std::copy_n(src, d, cache.values().data() + at);
    return;
  }
  runtime::convert_elements(src, DType::kF32, cache.bits16().data() + at, cache.dtype(),
                            static_cast<std::size_t>(d));
}

}  // namespace

KvCache KvCache::create(const runtime::DeviceMesh& mesh, const AttentionLayer& layer,
                        std::int64_t batch, std::int64_t max_len, KvLayout layout,
                        const AxisRule& batch_entry, DType dtype) {
  NUMESH_CHECK(batch > 0 && max_len > 0, ShapeError,
               "kv cache: batch {} and max_len {} must be positive", batch, max_len);
  check_kv_dtype(dtype, layer.config.head_dim, "kv cache");
  const std::int64_t hkv = layer.config.num_kv_heads, d = layer.config.head_dim;
  const AxisRule heads = layer.splits_kv_heads() ? AxisRule(layer.heads_axis) : AxisRule();
  KvCache cache;
  cache.layout = layout;
  cache.batch = batch;
  cache.max_len = max_len;
  const bool bthd = layout == KvLayout::kBTHD;
  const std::vector<std::int64_t> shape = bthd ? std::vector<std::int64_t>{batch, max_len, hkv, d}
                                               : std::vector<std::int64_t>{batch, hkv, max_len, d};
  const PartitionSpec spec = bthd ? PartitionSpec({batch_entry, AxisRule(), heads, AxisRule()})
                                  : PartitionSpec({batch_entry, heads, AxisRule(), AxisRule()});
  cache.k = std::make_shared<runtime::ShardedTensor>(mesh, shape, spec, dtype);
  cache.v = std::make_shared<runtime::ShardedTensor>(mesh, shape, spec, dtype);
  return cache;
}

PagedKvCache PagedKvCache::create(const runtime::DeviceMesh& mesh, const AttentionLayer& layer,
                                  std::int64_t blocks, std::int64_t block_size, DType dtype) {
  NUMESH_CHECK(blocks >= 2 && block_size >= 1, ShapeError,
               "paged kv cache: {} blocks of {} positions; it needs at least 2 blocks (block 0 "
               "takes the padding) of at least 1",
               blocks, block_size);
  check_kv_dtype(dtype, layer.config.head_dim, "kv cache");
  const AxisRule heads = layer.splits_kv_heads() ? AxisRule(layer.heads_axis) : AxisRule();
  const std::vector<std::int64_t> shape{blocks, layer.config.num_kv_heads, block_size,
                                        layer.config.head_dim};
  const PartitionSpec spec({AxisRule(), heads, AxisRule(), AxisRule()});
  PagedKvCache cache;
  cache.blocks = blocks;
  cache.block_size = block_size;
  cache.k = std::make_shared<runtime::ShardedTensor>(mesh, shape, spec, dtype);
  cache.v = std::make_shared<runtime::ShardedTensor>(mesh, shape, spec, dtype);
  return cache;
}

namespace {

// Refuses an x or y that does not fit the layer, and a cache step that does not fit its cache.
void attention_fwd_check_shapes(const AttentionLayer& layer, runtime::ShardedTensor& x,
                                runtime::ShardedTensor& y, const std::string& name,
                                const AttentionStep& step) {
  const std::int64_t hidden = layer.hidden;
  NUMESH_CHECK(x.shape().size() == 3 && x.shape()[2] == hidden && y.shape() == x.shape() &&
                   x.layout().shard_shape()[2] == hidden,
               ShapeError,
               "{}: x [{}] {} and y [{}] do not fit hidden {} (x is [B, T, H], H not split)", name,
               fmt::join(x.shape(), ", "), x.spec().repr(), fmt::join(y.shape(), ", "), hidden);
  const std::int64_t batch = x.shape()[0], t = x.shape()[1];
  KvCache* cache = step.cache;
  if (cache != nullptr) {
    NUMESH_CHECK(step.positions != nullptr, ValueError,
                 "{}: a cache step needs the sequences' positions", name);
    NUMESH_CHECK(
        cache->batch == batch && detail::entry(cache->k->spec(), 0) == detail::entry(x.spec(), 0),
        ShapeError, "{}: the cache holds {} sequences split {} but x has {} split {}", name,
        cache->batch, cache->k->spec().repr(), batch, x.spec().repr());
    NUMESH_CHECK(t <= cache->max_len, ShapeError,
                 "{}: {} tokens do not fit a cache of {} positions", name, t, cache->max_len);
  }
  NUMESH_CHECK((step.paged == nullptr) == (step.ragged == nullptr) &&
                   (step.paged == nullptr || cache == nullptr),
               ValueError,
               "{}: a paged step needs its cache and its ragged batch, and no dense cache", name);
  if (step.paged != nullptr) {
    const bool whole = batch == 1 && x.layout().shard_shape()[1] == t;
    NUMESH_CHECK(whole, ShapeError,
                 "{}: a ragged step takes x [1, N, H] with the tokens whole on every device, not "
                 "[{}] {}",
                 name, fmt::join(x.shape(), ", "), x.spec().repr());
    NUMESH_CHECK(step.ragged->max_context >= 1, ShapeError,
                 "{}: a ragged step's max_context {} must be positive", name,
                 step.ragged->max_context);
  }
}

// Refuses a ragged batch that does not describe `tokens` tokens in `paged`, naming the first
// bad entry (checked when the program runs: the caller fills it before each run).
void check_ragged(const RaggedBatch& r, const PagedKvCache& paged, std::int64_t tokens) {
  const auto n = static_cast<std::size_t>(tokens);
  NUMESH_CHECK(r.positions.size() == n && r.slots.size() == n && r.context.size() == n &&
                   r.table_of.size() == n,
               ShapeError,
               "attention: a ragged batch of {} positions, {} slots, {} context lengths and {} "
               "table offsets for {} tokens",
               r.positions.size(), r.slots.size(), r.context.size(), r.table_of.size(), tokens);
  const std::int64_t slots = paged.blocks * paged.block_size;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t blocks_seen = (r.context[i] + paged.block_size - 1) / paged.block_size;
    const bool fits = r.positions[i] >= 0 && r.slots[i] >= 0 && r.slots[i] < slots &&
                      r.context[i] >= 1 && r.context[i] <= r.max_context && r.table_of[i] >= 0 &&
                      r.table_of[i] + blocks_seen <= static_cast<std::int64_t>(r.tables.size());
    NUMESH_CHECK(fits, IndexError,
                 "attention: ragged token {} at position {} (slot {}, context {}, table at {}) "
                 "does not fit a cache of {} blocks of {}, max_context {} and {} table entries",
                 i, r.positions[i], r.slots[i], r.context[i], r.table_of[i], paged.blocks,
                 paged.block_size, r.max_context, r.tables.size());
    for (std::int64_t b = 0; b < blocks_seen; ++b) {
      const std::int32_t block = r.tables[static_cast<std::size_t>(r.table_of[i] + b)];
      NUMESH_CHECK(block >= 0 && block < paged.blocks, IndexError,
                   "attention: ragged token {}'s block table names block {} of {}", i, block,
                   paged.blocks);
    }
  }
}

// What every phase of the forward reads: the layer, x, the step's cache and positions, and the
// sizes.
struct AttentionFwd {
  ProgramBuilder& pb;
  const AttentionLayer& layer;
  runtime::ShardedTensor& x;
  const std::string& name;
  MatmulPrecision prec;  // of the fp32 products
  const runtime::DeviceMesh& mesh;
  const sharding::Mesh& m;
  std::int64_t hq, hkv, d, hidden, batch, t, local_batch;
  // Sequence parallelism: each device holds T/sp of the tokens; keys and values are
  // all-gathered over the sequence axes before attention (EasyDeL's non-ring path).
  std::int64_t local_t;
  std::vector<std::string> seq_axes;
  KvCache* cache;
  const std::vector<std::int64_t>* positions;
  PagedKvCache* paged;        // a ragged step over a paged cache (with `ragged`)
  const RaggedBatch* ragged;  // its tokens' positions, slots and block tables
  std::int64_t rows, lq, lkv;
};

// The shared state: the sizes from x and the layer, and the step's cache and positions.
AttentionFwd attention_fwd_context(ProgramBuilder& pb, const AttentionLayer& layer,
                                   runtime::ShardedTensor& x, const std::string& name,
                                   const AttentionStep& step) {
  const AttentionConfig& config = layer.config;
  const std::int64_t local_batch = x.layout().shard_shape()[0],
                     local_t = x.layout().shard_shape()[1];
  return AttentionFwd{
      .pb = pb,
      .layer = layer,
      .x = x,
      .name = name,
      .prec = pb.matmul_precision(),
      .mesh = pb.mesh(),
      .m = pb.mesh().mesh(),
      .hq = config.num_heads,
      .hkv = config.num_kv_heads,
      .d = config.head_dim,
      .hidden = layer.hidden,
      .batch = x.shape()[0],
      .t = x.shape()[1],
      .local_batch = local_batch,
      .local_t = local_t,
      .seq_axes = detail::axes_of(x.spec(), 1),
      .cache = step.cache,
      .positions = step.positions,
      .paged = step.paged,
      .ragged = step.ragged,
      .rows = local_batch * local_t,
      .lq = layer.local_q_heads,
      .lkv = layer.local_kv_heads,
  };
}

// The program's tensors the phases read and write: the weights, the cache, this run's keys and
// values, the output's partial sums (and their placements) and the optional rows.
struct AttentionFwdTensors {
  runtime::ShardedTensor& wq;
  runtime::ShardedTensor& wk;
  runtime::ShardedTensor& wv;
  runtime::ShardedTensor& wo;
  runtime::ShardedTensor* cache_k;
  runtime::ShardedTensor* cache_v;
  runtime::ShardedTensor& k_new;
  runtime::ShardedTensor& v_new;
  runtime::ShardedTensor& y_partial;
  std::vector<sharding::Placement> y_placed;
  runtime::ShardedTensor* bq;
  runtime::ShardedTensor* bk;
  runtime::ShardedTensor* bv;
  runtime::ShardedTensor* bo;
  runtime::ShardedTensor* q_norm;
  runtime::ShardedTensor* k_norm;
};

// Registers the forward's tensors with the program (in the order it has always registered them).
AttentionFwdTensors attention_fwd_tensors(const AttentionFwd& st) {
  ProgramBuilder& pb = st.pb;
  const AttentionLayer& layer = st.layer;
  const std::string& name = st.name;
  runtime::ShardedTensor& x = st.x;
  runtime::ShardedTensor& wq = pb.use(name + ".wq", TensorRole::kWeight, layer.wq);
  runtime::ShardedTensor& wk = pb.use(name + ".wk", TensorRole::kWeight, layer.wk);
  runtime::ShardedTensor& wv = pb.use(name + ".wv", TensorRole::kWeight, layer.wv);
  runtime::ShardedTensor& wo = pb.use(name + ".wo", TensorRole::kWeight, layer.wo);
  runtime::ShardedTensor* cache_k = nullptr;
  runtime::ShardedTensor* cache_v = nullptr;
  if (st.cache != nullptr) {
    cache_k = &pb.use(name + ".cache_k", TensorRole::kCache, st.cache->k);
    cache_v = &pb.use(name + ".cache_v", TensorRole::kCache, st.cache->v);
  }
  if (st.paged != nullptr) {
    cache_k = &pb.use(name + ".paged_k", TensorRole::kCache, st.paged->k);
    cache_v = &pb.use(name + ".paged_v", TensorRole::kCache, st.paged->v);
  }
  // This run's keys and values [B, T, kv_heads * D], split like x's tokens and wk's heads.
  const AxisRule kv_rule = layer.splits_kv_heads() ? AxisRule(layer.heads_axis) : AxisRule();
  const PartitionSpec kv_spec({detail::entry(x.spec(), 0), detail::entry(x.spec(), 1), kv_rule});
  runtime::ShardedTensor& k_new =
      pb.tensor(name + ".k", TensorRole::kActivation, {st.batch, st.t, st.hkv * st.d}, kv_spec);
  runtime::ShardedTensor& v_new =
      pb.tensor(name + ".v", TensorRole::kActivation, {st.batch, st.t, st.hkv * st.d}, kv_spec);
  runtime::ShardedTensor& y_partial =
      pb.tensor(name + ".partial", TensorRole::kActivation, x.shape(), x.spec());
  std::vector<sharding::Placement> y_placed = sharding::to_placements(x.spec(), st.m, 3);
  if (layer.splits_heads())
    y_placed[*st.m.find_axis(layer.heads_axis)] = sharding::Placement::partial();
  // The optional rows (biases, q/k norm weights), registered once; a device reads its shard.
  constexpr TensorRole kWeight = TensorRole::kWeight;
  return AttentionFwdTensors{
      .wq = wq,
      .wk = wk,
      .wv = wv,
      .wo = wo,
      .cache_k = cache_k,
      .cache_v = cache_v,
      .k_new = k_new,
      .v_new = v_new,
      .y_partial = y_partial,
      .y_placed = std::move(y_placed),
      .bq = pb.use_if_present(name + ".bq", kWeight, layer.bq),
      .bk = pb.use_if_present(name + ".bk", kWeight, layer.bk),
      .bv = pb.use_if_present(name + ".bv", kWeight, layer.bv),
      .bo = pb.use_if_present(name + ".bo", kWeight, layer.bo),
      .q_norm = pb.use_if_present(name + ".q_norm", kWeight, layer.q_norm),
      .k_norm = pb.use_if_present(name + ".k_norm", kWeight, layer.k_norm),
  };
}

// Per slot, the queries and (with `saved` and q/k norms) q and k as they entered the norms.
struct AttentionFwdQueries {
  std::vector<runtime::Tensor*> q_of, q_pre_of, k_pre_of;
};

// Per device: its sequences' q, k and v for its heads (biases added, Qwen3's q/k norms), with
// RoPE at the tokens' global positions. Fills `queries`.
runtime::Frontier attention_fwd_project_qkv(const AttentionFwd& st, const AttentionFwdTensors& tn,
                                            bool keeps_pre_norm, const runtime::Frontier& after,
                                            AttentionFwdQueries& queries) {
  ProgramBuilder& pb = st.pb;
  runtime::ShardedTensor& x = st.x;
  const MatmulPrecision prec = st.prec;
  const AttentionConfig& config = st.layer.config;
  const std::int64_t rows = st.rows, hidden = st.hidden, local_batch = st.local_batch,
                     local_t = st.local_t, lq = st.lq, lkv = st.lkv, d = st.d;
  const std::vector<std::int64_t>* positions = st.positions;
  const RaggedBatch* ragged = st.ragged;
  const double flops = attention_flops(config, hidden, local_batch, st.t, 0) *
                       static_cast<double>(lq) / static_cast<double>(st.hq) *
                       static_cast<double>(local_t) / static_cast<double>(st.t);
  return pb.per_device(st.name + ".qkv", {&after}, [&](std::int64_t s) {
    pb.add_flops(s, flops);
    const std::span<const float> bqs = detail::row_of(tn.bq, s), bks = detail::row_of(tn.bk, s),
                                 bvs = detail::row_of(tn.bv, s);
    const std::span<const float> qns = detail::row_of(tn.q_norm, s),
                                 kns = detail::row_of(tn.k_norm, s);
    // For the backward of the q/k norms: q and k as they enter them.
    runtime::Tensor* q_pre =
        keeps_pre_norm && tn.q_norm != nullptr ? &pb.scratch(s, {rows, lq * d}) : nullptr;
    runtime::Tensor* k_pre =
        keeps_pre_norm && tn.k_norm != nullptr ? &pb.scratch(s, {rows, lkv * d}) : nullptr;
    queries.q_pre_of[static_cast<std::size_t>(s)] = q_pre;
    queries.k_pre_of[static_cast<std::size_t>(s)] = k_pre;
    // The first global token of the slot's block of x's tokens, and its first sequence.
    const std::int64_t token_offset = x.layout().device(s).block[1] * local_t;
    const std::int64_t first_sequence = x.layout().device(s).block[0] * local_batch;
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& q = pb.scratch(s, {rows, lq * d});
    queries.q_of[static_cast<std::size_t>(s)] = &q;
    runtime::Tensor& k = tn.k_new.shard(s);
    runtime::Tensor& v = tn.v_new.shard(s);
    runtime::Tensor& wqs = tn.wq.shard(s);
    runtime::Tensor& wks = tn.wk.shard(s);
    runtime::Tensor& wvs = tn.wv.shard(s);
    // RoPE's frequencies, once for the program: a ragged step turns each token alone, and
    // building the table per call allocated per token and layer on every step.
    const std::vector<double> freq =
        config.rope_theta > 0.0f
            ? rope_frequencies(config.head_dim, static_cast<double>(config.rope_theta),
                               config.rope_scaling)
            : std::vector<double>();
    return [prec, &xs, &q, &k, &v, &wqs, &wks, &wvs, rows, hidden, local_batch, local_t, lq, lkv,
            token_offset, first_sequence, positions, ragged, config, bqs, bks, bvs, qns, kns, q_pre,
            k_pre, freq] {
      const std::int64_t dd = config.head_dim;
      const ConstMatrixMap xm(xs.values().data(), rows, hidden);
      const SharedInputProduct qkv[] = {
          {as_out_in_weight(wqs), as_matrix(q)},
          {as_out_in_weight(wks), MatrixMap(k.values().data(), rows, lkv * dd)},
          {as_out_in_weight(wvs), MatrixMap(v.values().data(), rows, lkv * dd)}};
      device_gemms(xm, qkv, prec);
      add_bias_rows(MatrixMap(q.values().data(), rows, lq * dd), bqs);
      add_bias_rows(MatrixMap(k.values().data(), rows, lkv * dd), bks);
      add_bias_rows(MatrixMap(v.values().data(), rows, lkv * dd), bvs);
      if (q_pre != nullptr)
        std::copy(q.values().begin(), q.values().end(), q_pre->values().begin());
      if (k_pre != nullptr)
        std::copy(k.values().begin(), k.values().end(), k_pre->values().begin());
      // Qwen3's RMSNorm of every head of q and k, before RoPE.
      if (!qns.empty()) {
        rmsnorm_rows(ConstMatrixMap(q.values().data(), rows * lq, dd),
                     ConstMatrixMap(qns.data(), 1, dd), MatrixMap(q.values().data(), rows * lq, dd),
                     {.eps = config.qk_norm_eps});
      }
      if (!kns.empty()) {
        rmsnorm_rows(ConstMatrixMap(k.values().data(), rows * lkv, dd),
                     ConstMatrixMap(kns.data(), 1, dd),
                     MatrixMap(k.values().data(), rows * lkv, dd), {.eps = config.qk_norm_eps});
      }
      if (config.rope_theta > 0.0f && ragged != nullptr) {
        // A ragged step: every token at its own sequence's position.
        NUMESH_CHECK(static_cast<std::int64_t>(ragged->positions.size()) == local_t, ShapeError,
                     "attention: {} ragged positions for {} tokens", ragged->positions.size(),
                     local_t);
        for (std::int64_t ti = 0; ti < local_t; ++ti) {
          const std::int64_t p = ragged->positions[static_cast<std::size_t>(ti)];
          rope_inplace(q.values().data() + ti * lq * dd, 1, 1, lq, dd, p, freq);
          rope_inplace(k.values().data() + ti * lkv * dd, 1, 1, lkv, dd, p, freq);
        }
      } else if (config.rope_theta > 0.0f) {
        // RoPE at the tokens' global positions, before the keys travel.
        for_each_run(positions, first_sequence, local_batch,
                     [&](std::int64_t b, std::int64_t n, std::int64_t p) {
                       rope_inplace(q.values().data() + b * local_t * lq * dd, n, local_t, lq, dd,
                                    p + token_offset, freq);
                       rope_inplace(k.values().data() + b * local_t * lkv * dd, n, local_t, lkv, dd,
                                    p + token_offset, freq);
                     });
      }
    };
  });
}

// The keys and values of every token (gathered over the sequence axes), each with the frontier
// after which it is complete.
struct AttentionFwdKeys {
  runtime::ShardedTensor& k_all;
  runtime::ShardedTensor& v_all;
  runtime::Frontier k_ready, v_ready;
};

// Keys and values of every token: gathered over the sequence axes (nothing when T is whole).
AttentionFwdKeys attention_fwd_gather_keys(const AttentionFwd& st, const AttentionFwdTensors& tn,
                                           const runtime::Frontier& projected) {
  runtime::Frontier k_ready = projected, v_ready = projected;
  runtime::ShardedTensor& k_all = st.pb.gather_over(tn.k_new, st.seq_axes, TensorRole::kActivation,
                                                    st.name + ".k_gathered", k_ready);
  runtime::ShardedTensor& v_all = st.pb.gather_over(tn.v_new, st.seq_axes, TensorRole::kActivation,
                                                    st.name + ".v_gathered", v_ready);
  return AttentionFwdKeys{
      .k_all = k_all, .v_all = v_all, .k_ready = std::move(k_ready), .v_ready = std::move(v_ready)};
}

// Per device: causal attention of its queries on its heads over every key, through the cache
// when the step has one (its new keys and values written at their positions first). Fills o_of.
runtime::Frontier attention_fwd_attend(const AttentionFwd& st, const AttentionFwdTensors& tn,
                                       const std::vector<runtime::Tensor*>& q_of,
                                       const AttentionFwdKeys& keys,
                                       const runtime::Frontier& projected,
                                       std::vector<runtime::Tensor*>& o_of) {
  ProgramBuilder& pb = st.pb;
  runtime::ShardedTensor& x = st.x;
  const AttentionConfig& config = st.layer.config;
  KvCache* cache = st.cache;
  const std::vector<std::int64_t>* positions = st.positions;
  const std::int64_t rows = st.rows, local_batch = st.local_batch, local_t = st.local_t, lq = st.lq,
                     d = st.d;
  const std::int64_t key_capacity = cache != nullptr ? cache->max_len : st.t;
  return pb.per_device(
      st.name + ".core", {&projected, &keys.k_ready, &keys.v_ready}, [&](std::int64_t s) {
        const std::int64_t token_offset = x.layout().device(s).block[1] * local_t;
        const std::int64_t first_sequence = x.layout().device(s).block[0] * local_batch;
        const AttentionSlice slice = st.layer.slice(x, s);
        runtime::Tensor& q = *q_of[static_cast<std::size_t>(s)];
        runtime::Tensor& k = keys.k_all.shard(s);
        runtime::Tensor& v = keys.v_all.shard(s);
        runtime::Tensor& o = pb.scratch(s, {rows, lq * d});
        o_of[static_cast<std::size_t>(s)] = &o;
        AttentionSlice widest = slice;
        widest.kv_len = key_capacity;
        const DType kv_dtype = tn.cache_k != nullptr ? tn.cache_k->dtype() : DType::kF32;
        runtime::Tensor& scores = pb.scratch(
            s, {attention_scratch_floats(widest, d, st.mesh.device(s).spec().threads, kv_dtype)});
        runtime::Tensor* ck = tn.cache_k != nullptr ? &tn.cache_k->shard(s) : nullptr;
        runtime::Tensor* cv = tn.cache_v != nullptr ? &tn.cache_v->shard(s) : nullptr;
        const KvLayout layout = cache != nullptr ? cache->layout : KvLayout::kBTHD;
        const std::int64_t max_len = cache != nullptr ? cache->max_len : 0;
        return [&q, &k, &v, &o, &scores, ck, cv, slice, config, layout, max_len, positions,
                first_sequence, token_offset] {
          const std::int64_t dd = config.head_dim;
          if (ck == nullptr) {
            const KvView kv{.k = k.values().data(),
                            .v = v.values().data(),
                            .batch_stride = slice.kv_len * slice.kv_heads * dd,
                            .pos_stride = slice.kv_heads * dd,
                            .head_stride = dd};
            attention_core(q.values().data(), kv, o.values().data(), slice, dd, token_offset,
                           config.causal, scores.values());
            return;
          }
          const bool bthd = layout == KvLayout::kBTHD;
          const KvView kv_cache{.k = ck->data(),
                                .v = cv->data(),
                                .batch_stride = max_len * slice.kv_heads * dd,
                                .pos_stride = bthd ? slice.kv_heads * dd : dd,
                                .head_stride = bthd ? dd : max_len * dd,
                                .dtype = ck->dtype()};
          const std::int64_t q_stride =
              slice.q_len * slice.q_heads * dd;  // floats per sequence of q and out
          for_each_run(
              positions, first_sequence, slice.batch,
              [&](std::int64_t b0, std::int64_t n, std::int64_t first) {
                NUMESH_CHECK(
                    first >= 0 && first + slice.kv_len <= max_len, IndexError,
                    "attention: tokens at positions [{}, {}) do not fit the cache of {} positions",
                    first, first + slice.kv_len, max_len);
                // Write every new key and value at its position (each sequence-parallel rank keeps
                // the whole cache).
                for (std::int64_t bi = b0; bi < b0 + n; ++bi) {
                  for (std::int64_t ti = 0; ti < slice.kv_len; ++ti) {
                    const std::int64_t row = (bi * slice.kv_len + ti) * slice.kv_heads * dd;
                    for (std::int64_t hi = 0; hi < slice.kv_heads; ++hi) {
                      const std::int64_t at = bi * kv_cache.batch_stride +
                                              (first + ti) * kv_cache.pos_stride +
                                              hi * kv_cache.head_stride;
                      store_cache_row(*ck, at, k.values().data() + row + hi * dd, dd);
                      store_cache_row(*cv, at, v.values().data() + row + hi * dd, dd);
                    }
                  }
                }
                // The run's sequences see the cache up to their own last new token.
                AttentionSlice run = slice;
                run.batch = n;
                run.kv_len = first + slice.kv_len;
                const KvView kv = kv_cache.from_sequence(b0);
                attention_core(q.values().data() + b0 * q_stride, kv,
                               o.values().data() + b0 * q_stride, run, dd, first + token_offset,
                               config.causal, scores.values());
              });
        };
      });
}

// Per device, a ragged step: every token's key and value written into its slot of the paged
// cache, then each token's attention over its own sequence's positions through its block table.
// Fills o_of.
runtime::Frontier attention_fwd_attend_paged(const AttentionFwd& st, const AttentionFwdTensors& tn,
                                             const std::vector<runtime::Tensor*>& q_of,
                                             const AttentionFwdKeys& keys,
                                             const runtime::Frontier& projected,
                                             std::vector<runtime::Tensor*>& o_of) {
  ProgramBuilder& pb = st.pb;
  const PagedKvCache& paged = *st.paged;
  const RaggedBatch& ragged = *st.ragged;
  const std::int64_t tokens = st.t, lq = st.lq, d = st.d, max_context = ragged.max_context;
  return pb.per_device(
      st.name + ".core", {&projected, &keys.k_ready, &keys.v_ready}, [&](std::int64_t s) {
        const AttentionSlice slice = st.layer.slice(st.x, s);
        runtime::Tensor& q = *q_of[static_cast<std::size_t>(s)];
        runtime::Tensor& k = keys.k_all.shard(s);
        runtime::Tensor& v = keys.v_all.shard(s);
        runtime::Tensor& o = pb.scratch(s, {tokens, lq * d});
        o_of[static_cast<std::size_t>(s)] = &o;
        runtime::Tensor& scores =
            pb.scratch(s, {paged_attention_scratch_floats(tokens, lq, d, max_context,
                                                          st.mesh.device(s).spec().threads)});
        runtime::Tensor& ck = tn.cache_k->shard(s);
        runtime::Tensor& cv = tn.cache_v->shard(s);
        const std::int64_t block_size = paged.block_size;
        return [&q, &k, &v, &o, &scores, &ck, &cv, &paged, &ragged, slice, tokens, d, block_size,
                max_context] {
          check_ragged(ragged, paged, tokens);
          const PagedKvView view{.k = ck.data(),
                                 .v = cv.data(),
                                 .block_size = block_size,
                                 .block_stride = slice.kv_heads * block_size * d,
                                 .head_stride = block_size * d,
                                 .pos_stride = d,
                                 .dtype = ck.dtype()};
          // Every token's key and value into its slot (the step's tokens before any reads
          // them: a prefill chunk's later tokens see its earlier ones).
          for (std::int64_t ti = 0; ti < tokens; ++ti) {
            const std::int64_t slot = ragged.slots[static_cast<std::size_t>(ti)];
            const std::int64_t base =
                (slot / block_size) * view.block_stride + (slot % block_size) * view.pos_stride;
            for (std::int64_t hi = 0; hi < slice.kv_heads; ++hi) {
              const std::int64_t row = (ti * slice.kv_heads + hi) * d;
              store_cache_row(ck, base + hi * view.head_stride, k.values().data() + row, d);
              store_cache_row(cv, base + hi * view.head_stride, v.values().data() + row, d);
            }
          }
          const RaggedKeys keys_of{
              .context = ragged.context, .table_of = ragged.table_of, .tables = ragged.tables};
          paged_attention(q.values().data(), view, keys_of, o.values().data(), tokens, slice, d,
                          max_context, scores.values());
        };
      });
}

// Per device: the output projection of its heads into y's partial sums (the output bias added
// once per reduction group).
runtime::Frontier attention_fwd_output_projection(const AttentionFwd& st,
                                                  const AttentionFwdTensors& tn,
                                                  const std::vector<runtime::Tensor*>& o_of,
                                                  const runtime::Frontier& attended) {
  const MatmulPrecision prec = st.prec;
  const std::int64_t rows = st.rows, hidden = st.hidden;
  return st.pb.per_device(st.name + ".out", {&attended}, [&](std::int64_t s) {
    runtime::Tensor& o = *o_of[static_cast<std::size_t>(s)];
    runtime::Tensor& wos = tn.wo.shard(s);
    runtime::Tensor& yp = tn.y_partial.shard(s);
    // The output bias is added once: by every device when heads are not split, else by the
    // first of the devices whose partial sums the all-reduce adds.
    const bool adds_bias =
        !st.layer.splits_heads() || st.mesh.coords(s)[*st.m.find_axis(st.layer.heads_axis)] == 0;
    const std::span<const float> bos = detail::row_of(tn.bo, s);
    return [prec, &o, &wos, &yp, rows, hidden, bos, adds_bias] {
      const MatrixMap ym(yp.values().data(), rows, hidden);
      device_gemm(as_matrix(std::as_const(o)), as_out_in_weight(wos), ym, prec);
      if (adds_bias) add_bias_rows(ym, bos);
    };
  });
}

}  // namespace

runtime::Frontier emit_attention(ProgramBuilder& pb, const AttentionLayer& layer,
                                 runtime::ShardedTensor& x, const runtime::Frontier& after,
                                 runtime::ShardedTensor& y, const std::string& name,
                                 const AttentionStep& step, AttentionSaved* saved) {
  attention_fwd_check_shapes(layer, x, y, name, step);
  const AttentionFwd st = attention_fwd_context(pb, layer, x, name, step);
  const AttentionFwdTensors tn = attention_fwd_tensors(st);
  const auto slots = static_cast<std::size_t>(st.mesh.size());
  AttentionFwdQueries queries{.q_of = std::vector<runtime::Tensor*>(slots),
                              .q_pre_of = std::vector<runtime::Tensor*>(slots),
                              .k_pre_of = std::vector<runtime::Tensor*>(slots)};
  const runtime::Frontier projected =
      attention_fwd_project_qkv(st, tn, saved != nullptr, after, queries);
  const AttentionFwdKeys keys = attention_fwd_gather_keys(st, tn, projected);

  std::vector<runtime::Tensor*> o_of(slots);
  NUMESH_CHECK(saved == nullptr || st.cache == nullptr, ValueError,
               "{}: a forward kept for the backward runs full sequences, without a cache", name);
  NUMESH_CHECK(saved == nullptr || st.paged == nullptr, ValueError,
               "{}: a forward kept for the backward runs full sequences, not a ragged step", name);
  const runtime::Frontier attended =
      st.paged != nullptr ? attention_fwd_attend_paged(st, tn, queries.q_of, keys, projected, o_of)
                          : attention_fwd_attend(st, tn, queries.q_of, keys, projected, o_of);
  const runtime::Frontier done = attention_fwd_output_projection(st, tn, o_of, attended);
  if (saved != nullptr) {
    *saved = AttentionSaved{.x = &x,
                            .k_local = &tn.k_new,
                            .k = &keys.k_all,
                            .v = &keys.v_all,
                            .q = queries.q_of,
                            .out = o_of,
                            .q_pre = queries.q_pre_of,
                            .k_pre = queries.k_pre_of,
                            .partial_placed = tn.y_placed};
  }
  return pb.reshard(tn.y_partial, tn.y_placed, y, sharding::to_placements(y.spec(), st.m, 3), done,
                    name + ".out");
}

AttentionSlice AttentionLayer::slice(const runtime::ShardedTensor& x, std::int64_t slot) const {
  const runtime::DeviceMesh& mesh = x.mesh();
  const std::int64_t head_rank =
      splits_heads() ? mesh.coords(slot)[*mesh.mesh().find_axis(heads_axis)] : 0;
  return AttentionSlice{.batch = x.layout().shard_shape()[0],
                        .q_len = x.layout().shard_shape()[1],
                        .kv_len = x.shape()[1],
                        .q_heads = local_q_heads,
                        .kv_heads = local_kv_heads,
                        .group = config.num_heads / config.num_kv_heads,
                        .q_head_offset = head_rank * local_q_heads,
                        .kv_head_offset = splits_kv_heads() ? head_rank * local_kv_heads : 0};
}

AttentionGradients AttentionGradients::like(const AttentionLayer& layer) {
  return AttentionGradients{.wq = gradient_like(*layer.wq),
                            .wk = gradient_like(*layer.wk),
                            .wv = gradient_like(*layer.wv),
                            .wo = gradient_like(*layer.wo),
                            .bq = optional_gradient_like(layer.bq),
                            .bk = optional_gradient_like(layer.bk),
                            .bv = optional_gradient_like(layer.bv),
                            .bo = optional_gradient_like(layer.bo),
                            .q_norm = optional_gradient_like(layer.q_norm),
                            .k_norm = optional_gradient_like(layer.k_norm)};
}

ShardedAttention::ShardedAttention(runtime::DeviceMesh mesh, const AttentionConfig& config,
                                   const AttentionWeights& w, std::int64_t batch,
                                   std::int64_t max_len, AttentionAxes axes, KvLayout layout)
    : mesh_(std::move(mesh)),
      axes_(std::move(axes)),
      layer_(AttentionLayer::create(mesh_, config, w, axes_)),
      batch_(batch) {
  NUMESH_CHECK(batch > 0 && max_len >= 0, ShapeError,
               "attention: batch {} must be positive and max_len {} not negative", batch, max_len);
  positions_.assign(static_cast<std::size_t>(batch),
                    0);  // a program run straight from program() starts at 0
  if (max_len > 0) {
    const std::vector<std::int64_t> x_shape{batch, 1, layer_.hidden};
    const PartitionSpec spec =
        sharding::correct_spec(
            x_shape,
            PartitionSpec({detail::entry_over(axes_.batch, mesh_.mesh()), AxisRule(), AxisRule()}),
            mesh_.mesh())
            .spec;
    cache_ = KvCache::create(mesh_, layer_, batch, max_len, layout, detail::entry(spec, 0));
  }
}

ShardedAttention::~ShardedAttention() = default;
ShardedAttention::ShardedAttention(ShardedAttention&&) noexcept = default;
ShardedAttention& ShardedAttention::operator=(ShardedAttention&&) noexcept = default;

Program& ShardedAttention::compiled_for(std::int64_t tokens) {
  return *programs_
              .get(tokens,
                   [&](std::int64_t t, std::monostate&) {
                     ProgramBuilder pb(mesh_, fmt::format("attention (T={})", t));
                     const std::vector<std::int64_t> shape{batch_, t, layer_.hidden};
                     const PartitionSpec spec =
                         sharding::correct_spec(
                             shape,
                             PartitionSpec({detail::entry_over(axes_.batch, mesh_.mesh()),
                                            detail::entry_over(axes_.sequence, mesh_.mesh()),
                                            AxisRule()}),
                             mesh_.mesh())
                             .spec;
                     runtime::Frontier loaded;
                     runtime::ShardedTensor& x = pb.input("x", shape, spec, loaded);
                     runtime::ShardedTensor& y = pb.tensor("y", TensorRole::kOutput, shape, spec);
                     pb.output("y", y,
                               emit_attention(pb, layer_, x, loaded, y, "attn",
                                              AttentionStep{.cache = cache_ ? &*cache_ : nullptr,
                                                            .positions = &positions_}));
                     return std::move(pb).compile();
                   })
              .program;
}

Program& ShardedAttention::program(std::int64_t tokens) {
  if (auto* e = programs_.find(tokens)) return *e->program;
  throw KeyError(std::to_string(tokens),
                 fmt::format("attention: no program compiled for {} tokens yet", tokens));
}

runtime::HostTensor ShardedAttention::forward(const runtime::HostTensor& x, std::int64_t position) {
  NUMESH_CHECK(
      x.shape.size() == 3 && x.shape[0] == batch_ && x.shape[1] > 0 && x.shape[2] == layer_.hidden,
      ShapeError, "attention: input is {} but the layer takes [{}, T, {}] with T >= 1",
      shape_text(x), batch_, layer_.hidden);
  const std::int64_t tokens = x.shape[1];
  if (!cache_) {
    NUMESH_CHECK(position == 0, IndexError,
                 "attention: position {} without a KV cache (max_len 0): full sequences start at 0",
                 position);
  } else {
    NUMESH_CHECK(position >= 0 && position + tokens <= cache_->max_len, IndexError,
                 "attention: {} tokens at position {} do not fit the KV cache of {} positions",
                 tokens, position, cache_->max_len);
  }
  Program& program = compiled_for(tokens);
  positions_.assign(static_cast<std::size_t>(batch_), position);
  return program.run("x", x, "y");
}

}  // namespace numesh::ops
