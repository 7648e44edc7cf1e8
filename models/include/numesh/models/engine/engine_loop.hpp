#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "numesh/models/engine/engine.hpp"
#include "numesh/models/engine/engine_following.hpp"

// A serving engine on a thread of its own, for front ends whose clients come and go on other
// threads (HTTP handlers, Python): clients submit requests and read each request's tokens from
// a stream of its own; the engine thread alone touches the engine, steps while any request
// waits or runs, and sleeps otherwise. A client that leaves cancels its request; the engine
// frees its blocks at its next step.
//
// On a mesh that spans ranks the loop runs on rank 0 and sends the calls it makes on its engine
// to the other ranks, which follow with follow_engine (engine_following.hpp): a step or a
// cancellation before making it, an admission once its id is known; when the loop ends, they
// return. A step that fails fails its requests on every rank alike (the others' steps fail the
// same way, and rank 0's cancellations reach them). A step that times out on a rank that hangs
// (TimeoutError), or a call that cannot be sent, ends the loop on its own: the requests get the
// error, later ones are refused as busy, failure() holds the error and on_failure is called,
// so that the front end can end every rank.

namespace numesh::models {

/// One request's tokens as the engine thread hands them over. Shared by the engine thread
/// (which appends) and one client thread (which reads); thread-safe.
class RequestStream {
 public:
  /// What the stream holds: tokens, then the end (why the request stopped) or an error.
  struct Event {
    std::int32_t token = -1;                  ///< a generated token (-1 for the end or an error)
    std::optional<StopReason> stopped{};      ///< set on the last token: why the request stopped
    std::string error{};                      ///< set when the request failed (the engine threw)
    std::optional<TokenLogprobs> logprobs{};  ///< the token's, when the request asked
  };

  /// Waits until events are there or `timeout` passes, and takes them (empty on timeout).
  std::vector<Event> take(std::chrono::milliseconds timeout);
  /// The client is gone (or no longer wants the rest): the engine cancels the request at its
  /// next step. Idempotent.
  void cancel() noexcept;
  /// Whether the request has ended (its last event handed over, or cancelled).
  [[nodiscard]] bool ended() const;

  // The engine thread's side.
  void push(Event event);
  [[nodiscard]] bool cancelled() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
  bool cancelled_ = false;
  bool ended_ = false;
};

/// What EngineLoop::submit gives: the request's stream, or why there is none.
struct Submitted {
  std::shared_ptr<RequestStream> stream;  ///< null when refused
  bool busy = false;                      ///< refused because max_waiting requests wait
  std::string error;                      ///< refused as bad input: Engine::submit's message
};

/// Counts a front end reports (/metrics), read at any time.
struct EngineCounts {
  std::int64_t running = 0, waiting = 0;
  std::int64_t blocks_used = 0, blocks_free = 0;
  std::int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  std::int64_t prefix_hit_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  ///< steps with prompt chunks / decodes only
};

/// The engine on its own thread. Not copyable; the destructor cancels every request and joins.
class EngineLoop {
 public:
  /// Starts the thread over `engine`, which must have been loaded with serving options, on
  /// rank 0 when its mesh spans ranks. `on_failure` (may be empty) is called on the engine
  /// thread when the loop ends on its own (failure()).
  /// Throws: ValueError otherwise.
  explicit EngineLoop(Engine engine, std::function<void()> on_failure = {});
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  /// Submits a request on the engine thread and waits for its answer: a stream, busy (the
  /// queue is full) or a refusal naming the bad input.
  [[nodiscard]] Submitted submit(std::vector<std::int32_t> prompt, const RequestOptions& options);
  /// The engine (its config, tokenizer, mesh): read-only, safe from any thread.
  [[nodiscard]] const Engine& engine() const noexcept { return engine_; }
  /// The counts as of the last step.
  [[nodiscard]] EngineCounts counts() const;
  /// What ended the loop on its own (a rank of its mesh that hangs, or that it cannot tell of
  /// its calls), or null while it has not. Thread-safe.
  [[nodiscard]] std::exception_ptr failure() const;
  /// Stops taking requests, lets the running and waiting ones finish (each ends normally),
  /// then stops the thread. Returns when it has. Idempotent.
  void drain();

 private:
  struct Pending {
    std::vector<std::int32_t> prompt;
    RequestOptions options;
    std::promise<Submitted>* answer;
  };
  void run();
  void apply(Pending& p);
  void step();
  // Refreshes the counts after a step (`out`; empty when none ran).
  void count(const EngineStep& out);

  // The engine's calls: sent to the ranks that follow (when any), then made here.
  std::optional<SequenceId> call_submit(Pending& p);
  void call_cancel(SequenceId id);
  const EngineStep& call_step();
  // Sends `call` to the followers; when that fails, ends the loop and returns false.
  bool tell(const EngineCall& call);
  // Ends the loop at its next turn with `error` (failure()), and calls on_failure_.
  void fail(std::exception_ptr error);

  Engine engine_;
  std::optional<EngineFollowers> followers_;  // set when the mesh spans ranks
  bool followers_lost_ = false;               // engine thread: a call could not be sent
  std::function<void()> on_failure_;
  mutable std::mutex mutex_;
  std::exception_ptr failure_;  // under mutex_
  std::condition_variable wake_;
  std::deque<Pending> inbox_;
  bool draining_ = false, stopping_ = false;
  std::vector<std::pair<SequenceId, std::shared_ptr<RequestStream>>> streams_;  // engine thread
  EngineCounts counts_;                                                         // under mutex_
  std::thread thread_;
};

}  // namespace numesh::models
