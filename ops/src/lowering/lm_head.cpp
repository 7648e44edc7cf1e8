#include "numesh/ops/lowering/lm_head.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "lowering_util.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/argmax.hpp"
#include "numesh/ops/kernels/gemm.hpp"
#include "numesh/sharding/corrected_sharding.hpp"

namespace numesh::ops {

namespace {

using detail::shape_text;
using sharding::AxisRule;
using sharding::PartitionSpec;

// Rows of a [rows, cols] tensor's shard.
std::int64_t local_rows(const runtime::ShardedTensor& t) { return t.layout().shard_shape()[0]; }

}  // namespace

LmHeadLayer LmHeadLayer::create(const runtime::DeviceMesh& mesh, const LmHeadWeights& w,
                                const LmHeadAxes& axes) {
  NUMESH_CHECK(w.weight.shape.size() == 2 && w.weight.shape[0] >= 1 && w.weight.shape[1] >= 1 &&
                   w.weight.shape[1] <= kMaxVocabulary,
               ShapeError, "lm head: weight {} must be [H, V] with H, V >= 1 and V <= {}",
               shape_text(w.weight), kMaxVocabulary);
  LmHeadLayer layer;
  layer.hidden = w.weight.shape[0];
  layer.vocab = w.weight.shape[1];
  const AxisRule vocab = mesh.mesh().has_axis(axes.vocab) ? AxisRule(axes.vocab) : AxisRule();
  // Stored out-in ([V, H], nn.Linear's and the embedding table's layout): decode reads each
  // token's weights in one run.
  layer.weight =
      detail::laid_out_out_in(mesh, w.weight, PartitionSpec({AxisRule(), vocab}), w.stored_as);
  return layer;
}

PartitionSpec lm_head_logits_spec(const LmHeadLayer& layer, const PartitionSpec& x_spec) {
  return PartitionSpec({detail::entry(x_spec, 0), detail::entry(layer.weight->spec(), 0)});
}

runtime::Frontier emit_lm_head(ProgramBuilder& pb, const LmHeadLayer& layer,
                               runtime::ShardedTensor& x, const runtime::Frontier& after,
                               runtime::ShardedTensor& logits, const std::string& name) {
  const MatmulPrecision prec = pb.matmul_precision();  // of the fp32 products
  NUMESH_CHECK(x.shape().size() == 2 && x.shape()[1] == layer.hidden &&
                   x.layout().shard_shape()[1] == layer.hidden &&
                   logits.shape() == (std::vector<std::int64_t>{x.shape()[0], layer.vocab}) &&
                   logits.spec() == lm_head_logits_spec(layer, x.spec()),
               ShapeError,
               "{}: x {} {} and logits {} {} do not fit hidden {} and vocabulary {} (H not split; "
               "logits {})",
               name, fmt::join(x.shape(), "x"), x.spec().repr(), fmt::join(logits.shape(), "x"),
               logits.spec().repr(), layer.hidden, layer.vocab,
               lm_head_logits_spec(layer, x.spec()).repr());
  runtime::ShardedTensor& w = pb.use(name + ".weight", TensorRole::kWeight, layer.weight);
  const std::int64_t rows = local_rows(x), h = layer.hidden, v_local = w.layout().shard_shape()[0];
  return pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& xs = x.shard(s);
    runtime::Tensor& ws = w.shard(s);
    runtime::Tensor& ls = logits.shard(s);
    pb.add_flops(s, 2.0 * static_cast<double>(rows * h * v_local));
    return [prec, &xs, &ws, &ls, rows, h, v_local] {
      device_gemm(ConstMatrixMap(xs.values().data(), rows, h), as_out_in_weight(ws),
                  MatrixMap(ls.values().data(), rows, v_local), prec);
    };
  });
}

runtime::Frontier emit_greedy_candidates(ProgramBuilder& pb, runtime::ShardedTensor& logits,
                                         const runtime::Frontier& after,
                                         runtime::ShardedTensor& candidates,
                                         const std::string& name) {
  const std::int64_t rows = local_rows(logits), v_local = logits.layout().shard_shape()[1];
  const std::int64_t shards = logits.shape()[1] / v_local;
  NUMESH_CHECK(candidates.shape() == (std::vector<std::int64_t>{logits.shape()[0], 2 * shards}) &&
                   candidates.spec() == logits.spec(),
               ShapeError,
               "{}: candidates {} {} do not fit logits {} {} (expected [{}, {}], the logits' spec)",
               name, fmt::join(candidates.shape(), "x"), candidates.spec().repr(),
               fmt::join(logits.shape(), "x"), logits.spec().repr(), logits.shape()[0], 2 * shards);
  return pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& ls = logits.shard(s);
    runtime::Tensor& cs = candidates.shard(s);
    const std::int64_t first = logits.layout().tile_offset(s)[1];
    return [&ls, &cs, rows, v_local, first] {
      row_argmax(ConstMatrixMap(ls.values().data(), rows, v_local), first, cs.values().data());
    };
  });
}

runtime::Frontier emit_top_k_candidates(ProgramBuilder& pb, runtime::ShardedTensor& logits,
                                        const runtime::Frontier& after,
                                        runtime::ShardedTensor& candidates, std::int64_t k,
                                        const std::string& name) {
  const std::int64_t rows = local_rows(logits), v_local = logits.layout().shard_shape()[1];
  const std::int64_t shards = logits.shape()[1] / v_local;
  NUMESH_CHECK(k >= 1 && k <= v_local, ShapeError,
               "{}: top-k {} must be between 1 and a device's {} tokens", name, k, v_local);
  NUMESH_CHECK(
      candidates.shape() == (std::vector<std::int64_t>{logits.shape()[0], 2 * k * shards}) &&
          candidates.spec() == logits.spec(),
      ShapeError, "{}: candidates {} {} do not fit logits {} {} and k {} (expected [{}, {}])", name,
      fmt::join(candidates.shape(), "x"), candidates.spec().repr(), fmt::join(logits.shape(), "x"),
      logits.spec().repr(), k, logits.shape()[0], 2 * k * shards);
  return pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& ls = logits.shard(s);
    runtime::Tensor& cs = candidates.shard(s);
    const std::int64_t first = logits.layout().tile_offset(s)[1];
    return [&ls, &cs, rows, v_local, first, k] {
      row_top_k(ConstMatrixMap(ls.values().data(), rows, v_local), first, k, cs.values().data());
    };
  });
}

runtime::Frontier emit_log_normalizers(ProgramBuilder& pb, runtime::ShardedTensor& logits,
                                       const runtime::Frontier& after,
                                       runtime::ShardedTensor& normalizers,
                                       const std::string& name) {
  const std::int64_t rows = local_rows(logits), v_local = logits.layout().shard_shape()[1];
  const std::int64_t shards = logits.shape()[1] / v_local;
  NUMESH_CHECK(
      normalizers.shape() == (std::vector<std::int64_t>{logits.shape()[0], shards}) &&
          normalizers.spec() == logits.spec(),
      ShapeError,
      "{}: normalizers {} {} do not fit logits {} {} (expected [{}, {}], the logits' spec)", name,
      fmt::join(normalizers.shape(), "x"), normalizers.spec().repr(),
      fmt::join(logits.shape(), "x"), logits.spec().repr(), logits.shape()[0], shards);
  return pb.per_device(name, {&after}, [&](std::int64_t s) {
    runtime::Tensor& ls = logits.shard(s);
    runtime::Tensor& ns = normalizers.shard(s);
    return [&ls, &ns, rows, v_local] {
      row_log_sum_exp(ConstMatrixMap(ls.values().data(), rows, v_local), ns.values().data());
    };
  });
}

std::vector<double> log_normalizers(const runtime::HostTensor& normalizers) {
  NUMESH_CHECK(normalizers.shape.size() == 2 && normalizers.shape[1] >= 1, ShapeError,
               "log normalizers: {} must be [rows, n]", shape_text(normalizers));
  const std::int64_t rows = normalizers.shape[0], n = normalizers.shape[1];
  std::vector<double> out(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* part = normalizers.data.data() + r * n;
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t i = 0; i < n; ++i)
      m = std::isnan(part[i]) ? part[i] : std::max<double>(m, part[i]);
    double sum = 0.0;
    if (!std::isnan(m) && !std::isinf(m)) {
      for (std::int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(part[i]) - m);
    }
    out[static_cast<std::size_t>(r)] = std::isnan(m) || std::isinf(m) ? m : m + std::log(sum);
  }
  return out;
}

void validate(const SamplingOptions& o) {
  NUMESH_CHECK(std::isfinite(o.temperature) && o.temperature > 0.0, ValueError,
               "sampling: temperature {} must be positive (greedy decoding takes no temperature)",
               o.temperature);
  NUMESH_CHECK(o.top_k >= 1, ValueError, "sampling: top-k {} must be at least 1", o.top_k);
  NUMESH_CHECK(o.top_p > 0.0 && o.top_p <= 1.0, ValueError, "sampling: top-p {} must be in (0, 1]",
               o.top_p);
}

std::int64_t CandidatePicker::greedy(std::span<const float> c) noexcept {
  const auto n = static_cast<std::int64_t>(c.size() / 2);
  // Shards in vocabulary order, so the first of equal values has the lowest index.
  std::int64_t best = 0;
  for (std::int64_t k = 1; k < n && !std::isnan(c[static_cast<std::size_t>(2 * best)]); ++k) {
    const float v = c[static_cast<std::size_t>(2 * k)];
    if (std::isnan(v) || v > c[static_cast<std::size_t>(2 * best)]) best = k;
  }
  return static_cast<std::int64_t>(c[static_cast<std::size_t>(2 * best + 1)]);
}

std::int64_t CandidatePicker::sample(std::span<const float> row, const SamplingOptions& o,
                                     std::mt19937_64& rng, std::int64_t r) {
  validate(o);
  const auto m = static_cast<std::int64_t>(row.size() / 2);
  sorted_.resize(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < m; ++i) {
    const float v = row[static_cast<std::size_t>(2 * i)];
    // -inf is a token the model rules out; NaN and +inf leave nothing sound to sample from.
    NUMESH_CHECK(!std::isnan(v) && v != std::numeric_limits<float>::infinity(), ValueError,
                 "sampling: row {} holds a logit of {}: nothing sound to sample from", r, v);
    sorted_[static_cast<std::size_t>(i)] = {
        v, static_cast<std::int64_t>(row[static_cast<std::size_t>(2 * i + 1)])};
  }
  // Largest first, the lower index first among equals: the global order whatever the devices.
  std::sort(sorted_.begin(), sorted_.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  NUMESH_CHECK(sorted_[0].first != -std::numeric_limits<float>::infinity(), ValueError,
               "sampling: row {} rules out every token (all its logits are -inf)", r);
  const auto keep = static_cast<std::size_t>(std::min<std::int64_t>(o.top_k, m));
  // Softmax of logit / temperature over the kept ones, in double, from the largest.
  p_.assign(keep, 0.0);
  double total = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    p_[i] =
        std::exp((static_cast<double>(sorted_[i].first) - static_cast<double>(sorted_[0].first)) /
                 o.temperature);
    total += p_[i];
  }
  // Top-p: the smallest prefix whose probability reaches top_p (at least one token).
  std::size_t n = 0;
  double mass = 0.0;
  while (n < keep && (n == 0 || mass < o.top_p * total)) mass += p_[n++];
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  double u = uniform(rng) * mass;
  std::size_t at = 0;
  while (at + 1 < n && u >= p_[at]) u -= p_[at++];
  return sorted_[at].second;
}

std::vector<std::int64_t> pick_sampled(const runtime::HostTensor& candidates,
                                       const SamplingOptions& o, std::mt19937_64& rng) {
  validate(o);
  NUMESH_CHECK(
      candidates.shape.size() == 2 && candidates.shape[1] >= 2 && candidates.shape[1] % 2 == 0,
      ShapeError, "sampling: candidates {} must be [rows, 2 * m]", shape_text(candidates));
  const std::int64_t rows = candidates.shape[0], width = candidates.shape[1];
  std::vector<std::int64_t> picked(static_cast<std::size_t>(rows));
  CandidatePicker picker;
  for (std::int64_t r = 0; r < rows; ++r) {
    picked[static_cast<std::size_t>(r)] = picker.sample(
        std::span<const float>(candidates.data)
            .subspan(static_cast<std::size_t>(r * width), static_cast<std::size_t>(width)),
        o, rng, r);
  }
  return picked;
}

std::vector<std::int64_t> pick_greedy(const runtime::HostTensor& candidates) {
  NUMESH_CHECK(
      candidates.shape.size() == 2 && candidates.shape[1] >= 2 && candidates.shape[1] % 2 == 0,
      ShapeError, "greedy pick: candidates {} must be [rows, 2 * shards]", shape_text(candidates));
  const std::int64_t rows = candidates.shape[0], width = candidates.shape[1];
  std::vector<std::int64_t> picked(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    picked[static_cast<std::size_t>(r)] = CandidatePicker::greedy(
        std::span<const float>(candidates.data)
            .subspan(static_cast<std::size_t>(r * width), static_cast<std::size_t>(width)));
  }
  return picked;
}

ShardedLmHead::ShardedLmHead(runtime::DeviceMesh mesh, const LmHeadWeights& weights,
                             std::int64_t rows, LmHeadAxes axes)
    : ShardedLmHead(mesh, LmHeadLayer::create(mesh, weights, axes), rows, axes) {}

ShardedLmHead::ShardedLmHead(runtime::DeviceMesh mesh, LmHeadLayer layer, std::int64_t rows,
                             LmHeadAxes axes, MatmulPrecision precision)
    : layer_(std::move(layer)), rows_(rows), precision_(precision), mesh_(mesh) {
  NUMESH_CHECK(rows >= 1, ShapeError, "lm head: {} rows; need at least one", rows);
  x_spec_ =
      sharding::correct_spec(
          {rows, layer_.hidden},
          PartitionSpec({detail::entry_over(axes.batch, mesh.mesh()), AxisRule()}), mesh.mesh())
          .spec;
  greedy_ = compile(kGreedy);
  logits_ = compile(kLogits);
}

std::unique_ptr<Program> ShardedLmHead::compile(std::int64_t tail, bool normalizers) const {
  // Every program projects x to the logits, then: returns them (kLogits), or each device's best
  // candidate per row (kGreedy), or its `tail` best (sampling's top-k), with each device's
  // log-sum-exp per row when `normalizers` (log-probabilities).
  ProgramBuilder pb(mesh_, tail == kLogits   ? std::string("lm head (logits)")
                           : tail == kGreedy ? std::string("lm head (greedy)")
                                             : fmt::format("lm head (top {}{})", tail,
                                                           normalizers ? ", normalizers" : ""));
  pb.set_matmul_precision(precision_);
  const PartitionSpec logits_spec = lm_head_logits_spec(layer_, x_spec_);
  runtime::Frontier loaded;
  runtime::ShardedTensor& x = pb.input("x", {rows_, layer_.hidden}, x_spec_, loaded);
  runtime::ShardedTensor& logits =
      pb.tensor("logits", tail == kLogits ? TensorRole::kOutput : TensorRole::kActivation,
                {rows_, layer_.vocab}, logits_spec);
  const runtime::Frontier projected = emit_lm_head(pb, layer_, x, loaded, logits, "lm_head");
  if (tail == kLogits) {
    pb.output("logits", logits, projected);
  } else {
    const std::int64_t shards = layer_.vocab / logits.layout().shard_shape()[1];
    const std::int64_t k = tail == kGreedy ? 1 : tail;
    runtime::ShardedTensor& candidates =
        pb.tensor("candidates", TensorRole::kOutput, {rows_, 2 * k * shards}, logits_spec);
    pb.output("candidates", candidates,
              tail == kGreedy
                  ? emit_greedy_candidates(pb, logits, projected, candidates, "greedy")
                  : emit_top_k_candidates(pb, logits, projected, candidates, k, "top_k"));
    if (normalizers) {
      runtime::ShardedTensor& sums =
          pb.tensor("normalizers", TensorRole::kOutput, {rows_, shards}, logits_spec);
      pb.output("normalizers", sums,
                emit_log_normalizers(pb, logits, projected, sums, "log_sum_exp"));
    }
  }
  return std::make_unique<Program>(std::move(pb).compile());
}

void ShardedLmHead::check_input(const runtime::HostTensor& x) const {
  // Compared in place: a step's check allocates nothing.
  const bool fits = x.shape.size() == 2 && x.shape[0] == rows_ && x.shape[1] == layer_.hidden;
  NUMESH_CHECK(fits, ShapeError, "lm head: input is {} but the head was compiled for [{}, {}]",
               shape_text(x), rows_, layer_.hidden);
}

std::vector<std::int64_t> ShardedLmHead::greedy(const runtime::HostTensor& x) {
  check_input(x);
  return pick_greedy(greedy_->run("x", x, "candidates"));
}

runtime::HostTensor ShardedLmHead::logits(const runtime::HostTensor& x) {
  check_input(x);
  return logits_->run("x", x, "logits");
}

std::vector<std::int64_t> ShardedLmHead::sample(const runtime::HostTensor& x,
                                                const SamplingOptions& options,
                                                std::mt19937_64& rng) {
  validate(options);
  return pick_sampled(candidates(x, options.top_k), options, rng);
}

Program& ShardedLmHead::top_k_program(std::int64_t k, bool normalizers) {
  NUMESH_CHECK(k >= 1, ValueError, "lm head: top_k {} must be at least 1", k);
  const std::int64_t v_local = layer_.weight->layout().shard_shape()[0];
  const std::int64_t kept = std::min(k, v_local);
  std::unique_ptr<Program>& program = (normalizers ? scored_top_k_ : top_k_)[kept];
  if (!program) program = compile(kept, normalizers);
  return *program;
}

const runtime::HostTensor& ShardedLmHead::candidates(const runtime::HostTensor& x, std::int64_t k) {
  Program& program = top_k_program(k, false);
  check_input(x);
  return program.run("x", x, "candidates");
}

ShardedLmHead::ScoredCandidates ShardedLmHead::scored_candidates(const runtime::HostTensor& x,
                                                                 std::int64_t k) {
  Program& program = top_k_program(k, true);
  check_input(x);
  program.set_input("x", x);
  program.run();
  return {program.output("candidates"), log_normalizers(program.output("normalizers"))};
}

}  // namespace numesh::ops
