#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "numesh/models/engine/engine.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/transport.hpp"

// A serving engine whose mesh spans ranks (processes under mpirun) is loaded on every rank,
// and each step is one run of its programs across them, so every rank's engine must make the
// same calls in the same order. Rank 0's engine decides them: its EngineLoop takes the clients'
// requests and cancellations and steps, and sends each call to the other ranks (a step or a
// cancellation before making it, an admission once it has its id); each other rank replays
// them with follow_engine. The scheduler is deterministic and every
// rank holds the same logits after a step (the model's outputs are gathered whole on every
// rank), so the same calls keep the engines the same: the same admissions, the same sequence
// ids, the same sampled tokens (each request's generator is seeded by its options). A follower
// checks the ids it gets against rank 0's and stops, naming both, when they differ.

namespace numesh::models {

/// The tag of the engine's calls on the mesh's transport: above every graph's transfers, which
/// therefore never match them.
inline constexpr int kEngineCallTag = runtime::kGraphTagLimit;

/// One call on rank 0's engine, as the other ranks replay it.
struct EngineCall {
  enum class Kind : std::uint8_t {
    kSubmit,  ///< Engine::submit(prompt, options), which gave rank 0 `sequence`
    kCancel,  ///< Engine::cancel(sequence)
    kStep,    ///< Engine::step()
    kFailed,  ///< rank 0's last step threw (its cancellations follow)
    kEnd,     ///< rank 0's loop has ended: follow_engine returns
  };
  Kind kind = Kind::kStep;
  SequenceId sequence = 0;
  std::vector<std::int32_t> prompt{};
  RequestOptions options{};
};

/// The call as bytes (every field of its kind, options included), and back.
[[nodiscard]] std::vector<std::byte> encode_engine_call(const EngineCall& call);
/// Throws: ValueError naming what is wrong with bytes that are not an encoded call (a wrong
/// mark, an unknown kind, a length past the end, bytes left over).
[[nodiscard]] EngineCall decode_engine_call(std::span<const std::byte> bytes);

/// Rank 0's side: sends each call to every other rank of a mesh, in order, over the mesh's
/// transport (a size, then the call's bytes, under kEngineCallTag). Not thread-safe: one thread
/// (the engine's) sends.
class EngineFollowers {
 public:
  /// REQUIRES: the mesh spans ranks and this is rank 0.
  /// Throws: ValueError naming the rank and the ranks otherwise.
  explicit EngineFollowers(const runtime::DeviceMesh& mesh);
  /// Sends `call` to ranks 1 to ranks() - 1 and returns when each has it.
  /// Throws: what the transport throws or a transfer failed with.
  void send(const EngineCall& call);

 private:
  std::shared_ptr<runtime::Transport> transport_;
  int ranks_ = 1;
};

/// On a rank other than 0 of a mesh that spans ranks: makes on `engine` the calls rank 0's
/// engine makes, as rank 0's EngineFollowers sends them, until its loop ends (kEnd). `engine`
/// must have been loaded with the options rank 0's was (numesh serve checks that every rank was
/// given the same options).
/// A step may fail on every rank alike (it threw on the same logits): rank 0 then says so
/// (kFailed) and cancels the step's requests, and so does this rank; a step that failed on
/// one side only ends the following with an error.
/// Throws: ValueError for an engine without serving options, on rank 0, or on a mesh that does
/// not span ranks; Error when this engine admits a request under another id than rank 0's, or
/// refuses one rank 0 admitted, or when a step failed here and not on rank 0 or the other way
/// round (naming both: the engines differ); a step's TimeoutError (a rank hangs) and what a
/// step throws that is no Error; what the transport throws. The caller should then end every
/// rank.
void follow_engine(Engine& engine);

}  // namespace numesh::models
