#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "numesh/runtime/tensor.hpp"

// Training's update rules on sharded parameters, each exactly as PyTorch defines it: AdamW
// (torch.optim.AdamW), the global-norm gradient clip (torch.nn.utils.clip_grad_norm_), and a
// learning rate warmed up linearly then held or decayed on a cosine (transformers'
// get_constant_schedule_with_warmup / get_cosine_schedule_with_warmup). Every device updates
// its own shards in its own arena; the optimizer's state is sharded like the parameters.

namespace numesh::ops {

/// torch.optim.AdamW's hyper-parameters, with its defaults.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

/// Throws: ValueError naming the value when lr, eps or weight_decay is negative or a beta is
/// outside [0, 1) (torch's own checks).
void validate(const AdamWOptions& options);

/// AdamW over a fixed list of fp32 parameters, as torch.optim.AdamW (amsgrad off, maximize
/// off) does for each element: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), at step t = 1, 2, ... The
/// moments m and v are fp32 tensors laid out like their parameter (so fsdp-sharded parameters
/// get sharded state, ZeRO's optimizer sharding); the scalars are computed in double and
/// applied in fp32, as torch applies them to fp32 tensors. Each device updates its shards over
/// all its threads, in chunks fixed by the sizes (the same bits for any thread count). A
/// replicated parameter is updated on every device that holds it, identically.
/// Not thread-safe: one thread drives an instance.
class AdamW {
 public:
  /// Zero moments for each of `parameters` (which the caller keeps alive), step 0.
  /// Throws: ValueError as validate(); ValueError when a parameter is null or not fp32.
  AdamW(std::vector<runtime::ShardedTensor*> parameters, AdamWOptions options);

  /// One step with gradients `grads` (one per parameter, same shape and layout, fp32) at
  /// learning rate `lr` (a schedule's value for this step; options().lr is the default), each
  /// gradient read as fp32(g x grad_scale): clip_coefficient() fused into the update, the same
  /// bits as clip_grad_norm() scaling the gradients first, without their extra pass. On a mesh
  /// over ranks each rank updates its own shards.
  /// Throws: ShapeError when a gradient does not match its parameter (naming its index, both
  /// shapes and specs); ValueError for a negative lr or a negative or non-finite grad_scale.
  void step(std::span<const runtime::ShardedTensor* const> grads, double lr,
            double grad_scale = 1.0);
  /// step(grads, options().lr).
  void step(std::span<const runtime::ShardedTensor* const> grads) { step(grads, options_.lr); }

  /// Steps taken.
  std::int64_t steps() const noexcept { return steps_; }
  /// The hyper-parameters.
  const AdamWOptions& options() const noexcept { return options_; }
  /// Parameter i's first and second moments (to save and restore the optimizer).
  runtime::ShardedTensor& exp_avg(std::size_t i) { return *exp_avg_.at(i); }
  runtime::ShardedTensor& exp_avg_sq(std::size_t i) { return *exp_avg_sq_.at(i); }
  /// Sets the step count (restoring a saved optimizer with its moments).
  /// Throws: ValueError for a negative count.
  void set_steps(std::int64_t steps);

 private:
  std::vector<runtime::ShardedTensor*> parameters_;
  std::vector<std::unique_ptr<runtime::ShardedTensor>> exp_avg_, exp_avg_sq_;
  AdamWOptions options_;
  std::int64_t steps_ = 0;
};

/// The total 2-norm of all gradients together, in double (each distinct shard counted once,
/// replicas not again; every device sums its shards over its threads in chunks fixed by the
/// sizes, so the result does not depend on the thread count). Non-finite values give a
/// non-finite norm. On a mesh over ranks each rank sums its own devices' shards and every rank
/// gets the total of one process, bit for bit: a collective, called by every rank in turn.
/// Throws: ValueError when a gradient is null or not fp32; what the transport throws.
double grad_norm(std::span<const runtime::ShardedTensor* const> grads);

/// torch.nn.utils.clip_grad_norm_'s scale for a total norm: min(1, max_norm / (total + 1e-6)).
/// Throws: ValueError when max_norm is not positive.
double clip_coefficient(double total_norm, double max_norm);

/// torch.nn.utils.clip_grad_norm_(grads, max_norm) with the 2-norm: the total norm of all
/// gradients together (each distinct shard counted once, replicas not again), then every
/// gradient scaled in place by clip_coefficient() (fp32 products). Returns the total norm
/// before clipping (in double; a non-finite total is returned as it is and scales the
/// gradients by NaN, as torch does without error_if_nonfinite).
/// Throws: ValueError when max_norm is not positive; ValueError when a gradient is not fp32.
double clip_grad_norm(std::span<runtime::ShardedTensor* const> grads, double max_norm);

/// The learning rate of step k (0-based): linear warm-up from 0 over `warmup` steps
/// (lr k / warmup), then lr held (kConstant) or decayed to 0 at `total` steps on a half cosine
/// (kCosine: lr (1 + cos(pi min(1, (k - warmup) / (total - warmup)))) / 2), as transformers'
/// schedules compute it up to `total` (past it transformers' cosine would rise again; this one
/// stays at 0).
struct LearningRateSchedule {
  enum class Kind { kConstant, kCosine };
  double lr = 1e-3;
  std::int64_t warmup = 0;
  std::int64_t total = 1;
  Kind kind = Kind::kConstant;

  /// Throws: ValueError for a negative lr or warmup, or total < 1 with kCosine.
  void validate() const;
  /// The rate at step k (k >= 0).
  double at(std::int64_t step) const noexcept;
};

}  // namespace numesh::ops
