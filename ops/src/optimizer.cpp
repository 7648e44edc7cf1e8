#include "numesh/ops/optimizer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numbers>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/slot_values.hpp"

namespace numesh::ops {

namespace {

// The shard's values as fp32 (the caller checked the dtype).
std::span<float> floats(runtime::Tensor& t) {
  return {static_cast<float*>(t.data()), static_cast<std::size_t>(t.size())};
}
std::span<const float> floats(const runtime::Tensor& t) {
  return {static_cast<const float*>(t.data()), static_cast<std::size_t>(t.size())};
}

// Elements per task of the update and the norm: 256 KiB of each array, a task long enough to
// outweigh its scheduling and short enough that a device's threads share the work evenly.
constexpr std::int64_t kChunk = std::int64_t{1} << 16;

// A range of one shard: elements [first, first + size) of tensor `tensor`.
struct Chunk {
  std::size_t tensor;
  std::int64_t first, size;
};

// Every shard of `sizes` (one size per tensor, on one device) cut into chunks of kChunk.
std::vector<Chunk> chunks_of(std::span<const std::int64_t> sizes) {
  std::vector<Chunk> chunks;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::int64_t at = 0; at < sizes[i]; at += kChunk)
      chunks.push_back({i, at, std::min(kChunk, sizes[i] - at)});
  }
  return chunks;
}

// Runs body(slot) once per device of `mesh` on this rank, each on its own device's arena, all
// at once: the body spreads its work over the device's threads with parallel_blocks.
void on_every_device(const runtime::DeviceMesh& mesh,
                     const std::function<void(std::int64_t)>& body) {
  runtime::GraphBuilder builder(mesh.device_set());
  for (const std::int64_t slot : mesh.local_slots()) {
    builder.add(mesh.device(slot).index(), fmt::format("optimizer[{}]", slot),
                [&body, slot] { body(slot); });
  }
  builder.compile().run();
}

// One step's scalars, in fp32 as torch applies Python floats to fp32 tensors.
struct AdamWScalars {
  float decay, step_size, inverse_correction2_sqrt, beta1, beta2, eps, grad_scale;
};

// AdamW on n elements: torch.optim.AdamW's in-place operations in its order, each in fp32, the
// gradient first scaled as clip_grad_norm scales it (exactly 1 leaves it as it is); dividing by
// sqrt(1 - b2^t) is a product with its inverse. A loop the compiler vectorizes: the scalars are
// locals and the arrays restrict, and optimizer.cpp is built without errno for sqrt and without
// FMA contraction, so the vector body and the scalar tail give the same bits.
void update_chunk(float* __restrict p, float* __restrict m, float* __restrict v,
                  const float* __restrict g, std::int64_t n, const AdamWScalars s) {
  const float b1 = s.beta1, b2 = s.beta2, decay = s.decay, step = s.step_size;
  const float inv_c2 = s.inverse_correction2_sqrt, eps = s.eps, scale = s.grad_scale;
  for (std::int64_t e = 0; e < n; ++e) {
    const float ge = g[e] * scale;
    m[e] = b1 * m[e] + (1.0f - b1) * ge;
    v[e] = b2 * v[e] + (1.0f - b2) * (ge * ge);
    p[e] = p[e] * decay - step * m[e] / (std::sqrt(v[e]) * inv_c2 + eps);
  }
}

// Per device, its shards of `tensors` tensors (sizes from size_of(slot, tensor)) cut into chunks;
// none for another rank's slots.
template <typename SizeOf>
std::vector<std::vector<Chunk>> chunks_per_device(const runtime::DeviceMesh& mesh,
                                                  std::size_t tensors, const SizeOf& size_of) {
  std::vector<std::vector<Chunk>> all;
  for (std::int64_t slot = 0; slot < mesh.size(); ++slot) {
    std::vector<std::int64_t> sizes;
    if (!mesh.is_local(slot)) {
      all.emplace_back();
      continue;
    }
    for (std::size_t i = 0; i < tensors; ++i) sizes.push_back(size_of(slot, i));
    all.push_back(chunks_of(sizes));
  }
  return all;
}

// body(slot, index, chunk) for every device's chunks (chunks_per_device): all devices at once,
// each spreading its chunks over its own threads; `index` counts the device's chunks in order.
template <typename Body>
void for_each_chunk(const runtime::DeviceMesh& mesh, const std::vector<std::vector<Chunk>>& chunks,
                    const Body& body) {
  on_every_device(mesh, [&](std::int64_t slot) {
    const std::vector<Chunk>& mine = chunks[static_cast<std::size_t>(slot)];
    parallel_blocks(static_cast<std::int64_t>(mine.size()), 1,
                    [&](std::int64_t first, std::int64_t last) {
                      for (std::int64_t c = first; c < last; ++c)
                        body(slot, c, mine[static_cast<std::size_t>(c)]);
                    });
  });
}

// The sum of squares of x in double, as eight interleaved partial sums (which vectorize),
// added in a fixed order.
double sum_of_squares(std::span<const float> x) {
  double acc[8] = {};
  const std::size_t whole = x.size() / 8 * 8;
  for (std::size_t i = 0; i < whole; i += 8) {
    for (std::size_t j = 0; j < 8; ++j)
      acc[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
  }
  for (std::size_t i = whole; i < x.size(); ++i)
    acc[i - whole] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void validate(const AdamWOptions& o) {
  NUMESH_CHECK(o.lr >= 0.0, ValueError, "adamw: invalid learning rate {}", o.lr);
  NUMESH_CHECK(o.eps >= 0.0, ValueError, "adamw: invalid epsilon {}", o.eps);
  NUMESH_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, ValueError,
               "adamw: invalid beta parameter at index 0: {}", o.beta1);
  NUMESH_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, ValueError,
               "adamw: invalid beta parameter at index 1: {}", o.beta2);
  NUMESH_CHECK(o.weight_decay >= 0.0, ValueError, "adamw: invalid weight_decay value {}",
               o.weight_decay);
}

AdamW::AdamW(std::vector<runtime::ShardedTensor*> parameters, AdamWOptions options)
    : parameters_(std::move(parameters)), options_(options) {
  validate(options_);
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const runtime::ShardedTensor* p = parameters_[i];
    NUMESH_CHECK(p != nullptr, ValueError, "adamw: parameter {} is null", i);
    NUMESH_CHECK(p->dtype() == DType::kF32, ValueError,
                 "adamw: parameter {} is {}; the master weights are f32", i, to_string(p->dtype()));
    exp_avg_.push_back(std::make_unique<runtime::ShardedTensor>(p->mesh(), p->shape(), p->spec()));
    exp_avg_sq_.push_back(
        std::make_unique<runtime::ShardedTensor>(p->mesh(), p->shape(), p->spec()));
  }
}

void AdamW::set_steps(std::int64_t steps) {
  NUMESH_CHECK(steps >= 0, ValueError, "adamw: step count {} is negative", steps);
  steps_ = steps;
}

void AdamW::step(std::span<const runtime::ShardedTensor* const> grads, double lr,
                 double grad_scale) {
  NUMESH_CHECK(grads.size() == parameters_.size(), ShapeError,
               "adamw: {} gradients for {} parameters", grads.size(), parameters_.size());
  NUMESH_CHECK(lr >= 0.0, ValueError, "adamw: invalid learning rate {}", lr);
  NUMESH_CHECK(grad_scale >= 0.0 && std::isfinite(grad_scale), ValueError,
               "adamw: the gradients' scale {} must be finite and not negative", grad_scale);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const runtime::ShardedTensor* g = grads[i];
    const runtime::ShardedTensor& p = *parameters_[i];
    NUMESH_CHECK(g != nullptr && g->dtype() == DType::kF32 && g->shape() == p.shape() &&
                     g->spec() == p.spec(),
                 ShapeError, "adamw: gradient {} is {} [{}] {} but its parameter is f32 [{}] {}", i,
                 g != nullptr ? to_string(g->dtype()) : "null",
                 g != nullptr ? fmt::format("{}", fmt::join(g->shape(), ", ")) : "",
                 g != nullptr ? g->spec().repr() : "", fmt::join(p.shape(), ", "), p.spec().repr());
  }
  ++steps_;
  if (parameters_.empty()) return;
  // torch's scalars, computed in double and applied in fp32 as torch's fp32 tensor ops apply
  // a Python float: the decay factor, the step size and sqrt of the second bias correction.
  const double t = static_cast<double>(steps_);
  const AdamWScalars scalars{
      .decay = static_cast<float>(1.0 - lr * options_.weight_decay),
      .step_size = static_cast<float>(lr / (1.0 - std::pow(options_.beta1, t))),
      .inverse_correction2_sqrt =
          static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(options_.beta2, t))),
      .beta1 = static_cast<float>(options_.beta1),
      .beta2 = static_cast<float>(options_.beta2),
      .eps = static_cast<float>(options_.eps),
      .grad_scale = static_cast<float>(grad_scale)};
  const runtime::DeviceMesh& mesh = parameters_.front()->mesh();
  const auto chunks = chunks_per_device(
      mesh, parameters_.size(),
      [&](std::int64_t slot, std::size_t i) { return parameters_[i]->shard(slot).size(); });
  for_each_chunk(mesh, chunks, [&](std::int64_t slot, std::int64_t, const Chunk& k) {
    update_chunk(floats(parameters_[k.tensor]->shard(slot)).data() + k.first,
                 floats(exp_avg_[k.tensor]->shard(slot)).data() + k.first,
                 floats(exp_avg_sq_[k.tensor]->shard(slot)).data() + k.first,
                 floats(grads[k.tensor]->shard(slot)).data() + k.first, k.size, scalars);
  });
}

double grad_norm(std::span<const runtime::ShardedTensor* const> grads) {
  for (std::size_t i = 0; i < grads.size(); ++i) {
    NUMESH_CHECK(grads[i] != nullptr && grads[i]->dtype() == DType::kF32, ValueError,
                 "clip_grad_norm: gradient {} is {}, not f32", i,
                 grads[i] != nullptr ? to_string(grads[i]->dtype()) : "null");
  }
  if (grads.empty()) return 0.0;
  const runtime::DeviceMesh& mesh = grads.front()->mesh();
  // Each device's distinct shards once (a replica's copy adds nothing new), chunk by chunk,
  // the chunks' sums added in order: the same bits for any thread count.
  const auto distinct_size = [&](std::int64_t slot, std::size_t i) {
    return grads[i]->layout().device(slot).replica_id == 0 ? grads[i]->shard(slot).size()
                                                           : std::int64_t{0};
  };
  const auto chunks = chunks_per_device(mesh, grads.size(), distinct_size);
  std::vector<std::vector<double>> sums;
  for (const std::vector<Chunk>& mine : chunks) sums.emplace_back(mine.size(), 0.0);
  for_each_chunk(mesh, chunks, [&](std::int64_t slot, std::int64_t index, const Chunk& k) {
    sums[static_cast<std::size_t>(slot)][static_cast<std::size_t>(index)] = sum_of_squares(
        floats(grads[k.tensor]->shard(slot))
            .subspan(static_cast<std::size_t>(k.first), static_cast<std::size_t>(k.size)));
  });
  // Each device's chunks in order, then the devices in order (as before: the same bits), the
  // devices of other ranks summed there.
  std::vector<double> per_device;
  for (const std::vector<double>& chunk_sums : sums) {
    double s = 0.0;
    for (const double x : chunk_sums) s += x;
    per_device.push_back(s);
  }
  double squares = 0.0;
  for (const double s : runtime::values_of_every_slot(mesh, std::move(per_device))) squares += s;
  return std::sqrt(squares);
}

double clip_coefficient(double total_norm, double max_norm) {
  NUMESH_CHECK(max_norm > 0.0, ValueError, "clip_grad_norm: max_norm {} must be positive",
               max_norm);
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

double clip_grad_norm(std::span<runtime::ShardedTensor* const> grads, double max_norm) {
  NUMESH_CHECK(max_norm > 0.0, ValueError, "clip_grad_norm: max_norm {} must be positive",
               max_norm);
  const std::vector<const runtime::ShardedTensor*> read(grads.begin(), grads.end());
  const double total = grad_norm(read);
  const double coefficient = clip_coefficient(total, max_norm);
  if (coefficient != 1.0 && !grads.empty()) {
    // As AdamW::step scales by its grad_scale: fp32 products.
    const auto c = static_cast<float>(coefficient);
    const runtime::DeviceMesh& mesh = grads.front()->mesh();
    const auto chunks = chunks_per_device(
        mesh, grads.size(),
        [&](std::int64_t slot, std::size_t i) { return grads[i]->shard(slot).size(); });
    for_each_chunk(mesh, chunks, [&](std::int64_t slot, std::int64_t, const Chunk& k) {
      for (float& x :
           floats(grads[k.tensor]->shard(slot))
               .subspan(static_cast<std::size_t>(k.first), static_cast<std::size_t>(k.size))) {
        x *= c;
      }
    });
  }
  return total;
}

void LearningRateSchedule::validate() const {
  NUMESH_CHECK(lr >= 0.0 && warmup >= 0, ValueError,
               "learning rate schedule: lr {} and warmup {} must not be negative", lr, warmup);
  NUMESH_CHECK(kind == Kind::kConstant || total >= 1, ValueError,
               "learning rate schedule: a cosine decay needs total steps >= 1, not {}", total);
}

double LearningRateSchedule::at(std::int64_t step) const noexcept {
  if (step < warmup)
    return lr * static_cast<double>(step) / static_cast<double>(std::max<std::int64_t>(1, warmup));
  if (kind == Kind::kConstant) return lr;
  // Held at 0 past `total` (transformers' formula, unclamped, would rise again there).
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) /
                        static_cast<double>(std::max<std::int64_t>(1, total - warmup)));
  return lr * std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

}  // namespace numesh::ops
