#include "numesh/ops/optimizer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {

namespace {

// The shard's values as fp32 (the caller checked the dtype).
std::span<float> floats(runtime::Tensor& t) { return {static_cast<float*>(t.data()), static_cast<std::size_t>(t.size())}; }
std::span<const float> floats(const runtime::Tensor& t) {
  return {static_cast<const float*>(t.data()), static_cast<std::size_t>(t.size())};
}

}  // namespace

void validate(const AdamWOptions& o) {
  NUMESH_CHECK(o.lr >= 0.0, ValueError, "adamw: invalid learning rate {}", o.lr);
  NUMESH_CHECK(o.eps >= 0.0, ValueError, "adamw: invalid epsilon {}", o.eps);
  NUMESH_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, ValueError, "adamw: invalid beta parameter at index 0: {}", o.beta1);
  NUMESH_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, ValueError, "adamw: invalid beta parameter at index 1: {}", o.beta2);
  NUMESH_CHECK(o.weight_decay >= 0.0, ValueError, "adamw: invalid weight_decay value {}", o.weight_decay);
}

AdamW::AdamW(std::vector<runtime::ShardedTensor*> parameters, AdamWOptions options)
    : parameters_(std::move(parameters)), options_(options) {
  validate(options_);
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const runtime::ShardedTensor* p = parameters_[i];
    NUMESH_CHECK(p != nullptr, ValueError, "adamw: parameter {} is null", i);
    NUMESH_CHECK(p->dtype() == DType::kF32, ValueError, "adamw: parameter {} is {}; the master weights are f32", i,
                 to_string(p->dtype()));
    exp_avg_.push_back(std::make_unique<runtime::ShardedTensor>(p->mesh(), p->shape(), p->spec()));
    exp_avg_sq_.push_back(std::make_unique<runtime::ShardedTensor>(p->mesh(), p->shape(), p->spec()));
  }
}

void AdamW::set_steps(std::int64_t steps) {
  NUMESH_CHECK(steps >= 0, ValueError, "adamw: step count {} is negative", steps);
  steps_ = steps;
}

void AdamW::step(std::span<const runtime::ShardedTensor* const> grads, double lr) {
  NUMESH_CHECK(grads.size() == parameters_.size(), ShapeError, "adamw: {} gradients for {} parameters", grads.size(),
               parameters_.size());
  NUMESH_CHECK(lr >= 0.0, ValueError, "adamw: invalid learning rate {}", lr);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const runtime::ShardedTensor* g = grads[i];
    const runtime::ShardedTensor& p = *parameters_[i];
    NUMESH_CHECK(g != nullptr && g->dtype() == DType::kF32 && g->shape() == p.shape() && g->spec() == p.spec(),
                 ShapeError, "adamw: gradient {} is {} [{}] {} but its parameter is f32 [{}] {}", i,
                 g != nullptr ? to_string(g->dtype()) : "null", g != nullptr ? fmt::format("{}", fmt::join(g->shape(), ", ")) : "",
                 g != nullptr ? g->spec().repr() : "", fmt::join(p.shape(), ", "), p.spec().repr());
  }
  ++steps_;
  // torch's scalars, in double: the decay factor, the step size and sqrt of the second bias
  // correction.
  const double t = static_cast<double>(steps_);
  const double decay = 1.0 - lr * options_.weight_decay;
  const double step_size = lr / (1.0 - std::pow(options_.beta1, t));
  const double correction2_sqrt = std::sqrt(1.0 - std::pow(options_.beta2, t));
  const auto b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
  const auto eps = static_cast<float>(options_.eps);
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    runtime::ShardedTensor& p = *parameters_[i];
    const runtime::ShardedTensor& g = *grads[i];
    runtime::ShardedTensor& m = *exp_avg_[i];
    runtime::ShardedTensor& v = *exp_avg_sq_[i];
    runtime::fill_shards(p, [&](std::int64_t slot, runtime::Tensor& shard) {
      const std::span<float> pv = floats(shard), mv = floats(m.shard(slot)), vv = floats(v.shard(slot));
      const std::span<const float> gv = floats(g.shard(slot));
      for (std::size_t e = 0; e < pv.size(); ++e) {
        // The order of torch's in-place operations, each rounded to fp32 as torch's fp32 tensors are.
        pv[e] = static_cast<float>(pv[e] * decay);
        mv[e] = b1 * mv[e] + (1.0f - b1) * gv[e];
        vv[e] = b2 * vv[e] + (1.0f - b2) * gv[e] * gv[e];
        const float denom = static_cast<float>(std::sqrt(static_cast<double>(vv[e])) / correction2_sqrt) + eps;
        pv[e] = static_cast<float>(pv[e] - step_size * static_cast<double>(mv[e] / denom));
      }
    });
  }
}

double clip_grad_norm(std::span<runtime::ShardedTensor* const> grads, double max_norm) {
  NUMESH_CHECK(max_norm > 0.0, ValueError, "clip_grad_norm: max_norm {} must be positive", max_norm);
  double squares = 0.0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    runtime::ShardedTensor& g = *grads[i];
    NUMESH_CHECK(g.dtype() == DType::kF32, ValueError, "clip_grad_norm: gradient {} is {}, not f32", i,
                 to_string(g.dtype()));
    // Each device's distinct shard once: a replica's copy adds nothing new.
    std::vector<double> per_slot(static_cast<std::size_t>(g.mesh().size()), 0.0);
    runtime::fill_shards(g, [&](std::int64_t slot, runtime::Tensor& shard) {
      if (g.layout().device(slot).replica_id != 0) return;
      double s = 0.0;
      for (const float x : floats(std::as_const(shard))) s += static_cast<double>(x) * static_cast<double>(x);
      per_slot[static_cast<std::size_t>(slot)] = s;
    });
    for (const double s : per_slot) squares += s;
  }
  const double total = std::sqrt(squares);
  const double coefficient = std::min(1.0, max_norm / (total + 1e-6));
  if (coefficient != 1.0) {
    for (runtime::ShardedTensor* g : grads) {
      runtime::fill_shards(*g, [&](std::int64_t, runtime::Tensor& shard) {
        for (float& x : floats(shard)) x = static_cast<float>(x * coefficient);
      });
    }
  }
  return total;
}

void LearningRateSchedule::validate() const {
  NUMESH_CHECK(lr >= 0.0 && warmup >= 0, ValueError, "learning rate schedule: lr {} and warmup {} must not be negative",
               lr, warmup);
  NUMESH_CHECK(kind == Kind::kConstant || total >= 1, ValueError,
               "learning rate schedule: a cosine decay needs total steps >= 1, not {}", total);
}

double LearningRateSchedule::at(std::int64_t step) const noexcept {
  if (step < warmup) return lr * static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(1, warmup));
  if (kind == Kind::kConstant) return lr;
  // Held at 0 past `total` (transformers' formula, unclamped, would rise again there).
  const double progress = std::min(
      1.0, static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(1, total - warmup)));
  return lr * std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

}  // namespace numesh::ops
