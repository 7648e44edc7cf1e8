#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/lm_head_config.hpp"
#include "numesh/ops/lowering/program.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"

// The LM head lowered onto a device mesh, vocabulary-parallel: each device multiplies the final
// hidden states by its columns of the head's matrix, and greedy decoding picks the token from
// each device's best candidate, so the full logits never travel unless asked for.

namespace numesh::ops {

/// Mesh axes the head is split over. Every field has a default (eformer's axis names; EasyDeL
/// lays lm_head out with the vocabulary over tp).
struct LmHeadAxes {
  /// Rows (tokens) are split over these axes; replicated when the row count does not divide.
  std::vector<std::string> batch = {"dp", "fsdp"};
  /// The vocabulary is split over this axis; replicated (each device all of it) when the mesh
  /// lacks it or V does not divide.
  std::string vocab = "tp";
};

/// The head's matrix laid out on a mesh: w [H, V] P(None, vocab), stored out-in ([V, H], spec
/// swapped; WeightLayout::kOutIn), each shard on its device's node, in LmHeadWeights::stored_as.
struct LmHeadLayer {
  std::int64_t hidden = 0;
  std::int64_t vocab = 0;
  std::shared_ptr<runtime::ShardedTensor> weight;

  /// Throws: ShapeError naming the shape when the weight is not [H, V] with H, V >= 1 or V is
  /// above kMaxVocabulary.
  [[nodiscard]] static LmHeadLayer create(const runtime::DeviceMesh& mesh,
                                          const LmHeadWeights& weights,
                                          const LmHeadAxes& axes = {});
};

/// Emits per device logits_local = x_local w_local (device_gemm over the device's threads)
/// into `logits` [rows, V], whose spec must split rows as x does and V as the weight does
/// (lm_head_logits_spec()). x is [rows, H] with H not split. Returns the frontier after which
/// the logits are complete; nothing crosses devices.
/// Throws: ShapeError naming the shapes and specs when x or logits do not fit the layer.
runtime::Frontier emit_lm_head(ProgramBuilder& program, const LmHeadLayer& layer,
                               runtime::ShardedTensor& x, const runtime::Frontier& after,
                               runtime::ShardedTensor& logits, const std::string& name);

/// The spec of the logits for x's spec (rows) and the layer's weight (vocabulary).
sharding::PartitionSpec lm_head_logits_spec(const LmHeadLayer& layer,
                                            const sharding::PartitionSpec& x_spec);

/// Emits the devices' half of a greedy pick: for each row, each device's best logit and its
/// global token index (row_argmax) into `candidates` [rows, 2 * n], n the vocabulary shards of
/// `logits`, spec as the logits' (each device holds its [rows_local, 2]). pick_greedy() on the
/// gathered candidates finishes the argmax.
/// Throws: ShapeError when candidates does not fit the logits.
runtime::Frontier emit_greedy_candidates(ProgramBuilder& program, runtime::ShardedTensor& logits,
                                         const runtime::Frontier& after,
                                         runtime::ShardedTensor& candidates,
                                         const std::string& name);

/// The host's half of a greedy pick: each row's token from candidates [rows, 2 * n] (value,
/// index pairs in vocabulary order): the largest value, the lowest index on ties, the first NaN
/// if any (torch.argmax's rule over the whole row).
/// Throws: ShapeError when candidates is not [rows, 2 * n] with n >= 1.
std::vector<std::int64_t> pick_greedy(const runtime::HostTensor& candidates);

/// Emits the devices' half of top-k sampling: each device's `k` best logits per row with their
/// global indices (row_top_k) into `candidates` [rows, 2 * k * n], spec as the logits'. The
/// global top-k is among them (each device's k best include every one of its tokens in it).
/// Throws: ShapeError when candidates does not fit, or k exceeds a device's vocabulary slice.
runtime::Frontier emit_top_k_candidates(ProgramBuilder& program, runtime::ShardedTensor& logits,
                                        const runtime::Frontier& after,
                                        runtime::ShardedTensor& candidates, std::int64_t k,
                                        const std::string& name);

/// Emits the devices' half of the softmax's normaliser: each device's log-sum-exp of its logits
/// per row (row_log_sum_exp) into `normalizers` [rows, n], spec as the logits' (each device
/// holds its [rows_local, 1]). log_normalizers() on the gathered tensor finishes it.
/// Throws: ShapeError when normalizers does not fit the logits.
runtime::Frontier emit_log_normalizers(ProgramBuilder& program, runtime::ShardedTensor& logits,
                                       const runtime::Frontier& after,
                                       runtime::ShardedTensor& normalizers,
                                       const std::string& name);

/// The host's half: each row's log(sum over the vocabulary of exp(logit)) from the devices'
/// parts [rows, n], combined in device order in double (the same bits whatever else the rows
/// hold). A token's log-probability is its logit minus its row's value.
/// Throws: ShapeError when normalizers is not [rows, n] with n >= 1.
std::vector<double> log_normalizers(const runtime::HostTensor& normalizers);

/// How the next token is drawn from the logits: logits / temperature, the top_k largest kept,
/// softmax over them, then the smallest set of the most likely whose probabilities sum to
/// top_p or more (at least one token), renormalised (Hugging Face's and llama.cpp's order).
struct SamplingOptions {
  double temperature = 1.0;  ///< > 0
  std::int64_t top_k = 40;   ///< >= 1
  double top_p = 1.0;        ///< in (0, 1]
};

/// Checks the options. Throws: ValueError naming the bad value.
void validate(const SamplingOptions& options);

/// The host's half of sampling: each row's token drawn from its candidates [rows, 2 * m]
/// ((value, index) pairs: every device's best, in any order) as `options` say, with `rng`.
/// Throws: ShapeError for a malformed candidates tensor; ValueError when a row holds a NaN or
/// +inf logit, or only -inf ones (nothing sound to sample from; -inf alone rules a token out);
/// as validate().
std::vector<std::int64_t> pick_sampled(const runtime::HostTensor& candidates,
                                       const SamplingOptions& options, std::mt19937_64& rng);

/// pick_greedy and pick_sampled one row at a time, for a caller that picks each row by its own
/// options (a serving step): the same picks, and no allocation once the sampler's scratch has
/// room for a row's candidates. Not thread-safe: one thread uses an instance.
class CandidatePicker {
 public:
  /// Greedy's pick of one row [2 * n] of (value, index) pairs in vocabulary order: the first
  /// best (the lowest index among equals, a NaN first). REQUIRES: n >= 1.
  [[nodiscard]] static std::int64_t greedy(std::span<const float> row) noexcept;
  /// A draw from one row [2 * m] (every device's best, any order) as pick_sampled draws each;
  /// `row_index` names the row in errors.
  /// Throws: as pick_sampled.
  [[nodiscard]] std::int64_t sample(std::span<const float> row, const SamplingOptions& options,
                                    std::mt19937_64& rng, std::int64_t row_index = 0);

 private:
  std::vector<std::pair<float, std::int64_t>> sorted_;
  std::vector<double> p_;
};

/// The LM head lowered onto a device mesh for a fixed number of rows, as two programs compiled
/// once: greedy() (logits stay on the devices, only each device's best candidate per row comes
/// back) and logits() (the whole [rows, V] gathered to the host).
/// Not thread-safe: one thread drives an instance.
class ShardedLmHead {
 public:
  /// Lays out the weight and compiles both programs for `rows` rows.
  /// Throws: as LmHeadLayer::create; ShapeError when rows < 1.
  ShardedLmHead(runtime::DeviceMesh mesh, const LmHeadWeights& weights, std::int64_t rows,
                LmHeadAxes axes = {});
  /// The same over a layer already laid out on `mesh` (heads for several row counts share it),
  /// its products computed in `precision` (kRowInvariant: a serving engine's, each row's
  /// logits the same whatever rows are beside it).
  /// Throws: ShapeError when rows < 1.
  ShardedLmHead(runtime::DeviceMesh mesh, LmHeadLayer layer, std::int64_t rows,
                LmHeadAxes axes = {}, MatmulPrecision precision = MatmulPrecision::kF32);
  /// The argmax token of each row of x [rows, H] (torch.argmax's rule).
  /// Throws: ShapeError when x is not [rows, H]; what a node throws.
  std::vector<std::int64_t> greedy(const runtime::HostTensor& x);
  /// The logits [rows, V] of x [rows, H].
  /// Throws: as greedy().
  runtime::HostTensor logits(const runtime::HostTensor& x);
  /// Each row of x's token drawn as `options` say (pick_sampled over every device's top_k
  /// candidates: only those come back to the host). A program per top_k, compiled on first use.
  /// Throws: as greedy() and pick_sampled().
  std::vector<std::int64_t> sample(const runtime::HostTensor& x, const SamplingOptions& options,
                                   std::mt19937_64& rng);
  /// Every device's best min(k, its share of V) logits of each row of x [rows, H], as (value,
  /// id) pairs [rows, 2 * m] in device order (pick_sampled's candidates; their best is the
  /// row's argmax). A program per k, compiled on first use. The program's output, valid until
  /// the next call of candidates() or sample() (copy it to keep it).
  /// Throws: as greedy(); ValueError for k < 1.
  const runtime::HostTensor& candidates(const runtime::HostTensor& x, std::int64_t k);
  /// candidates() with each row's log-sum-exp over the whole vocabulary (log_normalizers), for
  /// log-probabilities: a token's is its logit minus its row's normaliser. A program per k,
  /// compiled on first use (the normaliser reads every logit: only callers that want
  /// log-probabilities pay for it).
  /// Throws: as candidates().
  struct ScoredCandidates {
    runtime::HostTensor candidates;
    std::vector<double> log_normalizers;
  };
  ScoredCandidates scored_candidates(const runtime::HostTensor& x, std::int64_t k);
  /// The weight's spec after correction (P(None, 'tp') when V divides tp, else replicated).
  sharding::PartitionSpec weight_spec() const { return swap_last_two(layer_.weight->spec(), 2); }
  /// Programs compiled so far: greedy, logits and one per top-k used (with and without
  /// normalisers).
  std::int64_t compiled_programs() const noexcept {
    return 2 + static_cast<std::int64_t>(top_k_.size() + scored_top_k_.size());
  }
  /// The greedy program (plan, graph).
  Program& greedy_program() noexcept { return *greedy_; }

 private:
  void check_input(const runtime::HostTensor& x) const;
  // The program ending in `tail`: kLogits, kGreedy, or a top-k of that many candidates.
  static constexpr std::int64_t kLogits = 0;
  static constexpr std::int64_t kGreedy = -1;
  std::unique_ptr<Program> compile(std::int64_t tail, bool normalizers = false) const;
  // The top-k program of min(k, a device's vocabulary), with normalisers or not.
  Program& top_k_program(std::int64_t k, bool normalizers);

  LmHeadLayer layer_;
  std::int64_t rows_;
  MatmulPrecision precision_ = MatmulPrecision::kF32;
  runtime::DeviceMesh mesh_;
  sharding::PartitionSpec x_spec_;
  std::unique_ptr<Program> greedy_;
  std::unique_ptr<Program> logits_;
  std::map<std::int64_t, std::unique_ptr<Program>> top_k_;         // by k
  std::map<std::int64_t, std::unique_ptr<Program>> scored_top_k_;  // by k, with normalisers
};

}  // namespace numesh::ops
