#include "numesh/models/engine/engine_loop.hpp"

#include <algorithm>
#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

std::vector<RequestStream::Event> RequestStream::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !events_.empty() || cancelled_; });
  std::vector<Event> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

void RequestStream::cancel() noexcept {
  const std::lock_guard lock(mutex_);
  cancelled_ = true;
  ready_.notify_all();
}

bool RequestStream::ended() const {
  const std::lock_guard lock(mutex_);
  return (ended_ && events_.empty()) || cancelled_;
}

bool RequestStream::cancelled() const {
  const std::lock_guard lock(mutex_);
  return cancelled_;
}

void RequestStream::push(Event event) {
  const std::lock_guard lock(mutex_);
  if (event.stopped || !event.error.empty()) ended_ = true;
  events_.push_back(std::move(event));
  ready_.notify_all();
}

EngineLoop::EngineLoop(Engine engine, std::function<void()> on_failure)
    : engine_(std::move(engine)), on_failure_(std::move(on_failure)) {
  (void)engine_.scheduler();  // throws ValueError without serving options
  if (engine_.mesh().ranks() > 1) followers_.emplace(engine_.mesh());  // throws off rank 0
  count(EngineStep{});  // the counts before the first step: every block free
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Submitted EngineLoop::submit(std::vector<std::int32_t> prompt, const RequestOptions& options) {
  std::promise<Submitted> answer;
  std::future<Submitted> result = answer.get_future();
  {
    const std::lock_guard lock(mutex_);
    if (draining_ || stopping_) return Submitted{.stream = nullptr, .busy = true, .error = {}};
    inbox_.push_back(Pending{std::move(prompt), options, &answer});
  }
  wake_.notify_all();
  return result.get();
}

EngineCounts EngineLoop::counts() const {
  const std::lock_guard lock(mutex_);
  return counts_;
}

void EngineLoop::drain() {
  {
    const std::lock_guard lock(mutex_);
    draining_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool EngineLoop::tell(const EngineCall& call) {
  if (!followers_ || followers_lost_) return !followers_lost_;
  try {
    followers_->send(call);
    return true;
  } catch (const std::exception&) {
    followers_lost_ = true;
    fail(std::current_exception());
    return false;
  }
}

void EngineLoop::fail(std::exception_ptr error) {
  {
    const std::lock_guard lock(mutex_);
    if (!failure_) failure_ = std::move(error);
    stopping_ = true;
  }
  if (on_failure_) on_failure_();
}

std::exception_ptr EngineLoop::failure() const {
  const std::lock_guard lock(mutex_);
  return failure_;
}

std::optional<SequenceId> EngineLoop::call_submit(Pending& p) {
  if (!followers_) return engine_.submit(std::move(p.prompt), p.options);
  // The followers replay only what this engine admitted, under the id it gave; one they cannot
  // be told of is cancelled here.
  std::vector<std::int32_t> prompt = p.prompt;
  const std::optional<SequenceId> id = engine_.submit(std::move(p.prompt), p.options);
  if (id && !tell({.kind = EngineCall::Kind::kSubmit,
                   .sequence = *id,
                   .prompt = std::move(prompt),
                   .options = p.options})) {
    engine_.cancel(*id);  // the loop is ending: refused as busy
    return std::nullopt;
  }
  return id;
}

void EngineLoop::call_cancel(SequenceId id) {
  (void)tell({.kind = EngineCall::Kind::kCancel, .sequence = id});
  engine_.cancel(id);
}

const EngineStep& EngineLoop::call_step() {
  if (!tell({.kind = EngineCall::Kind::kStep}))
    throw Error("the engine's other ranks cannot be reached: the server is shutting down");
  return engine_.step();
}

void EngineLoop::apply(Pending& p) {
  Submitted s;
  try {
    const std::optional<SequenceId> id = call_submit(p);
    if (!id) {
      s.busy = true;
    } else {
      s.stream = std::make_shared<RequestStream>();
      streams_.emplace_back(*id, s.stream);
    }
  } catch (const Error& e) {
    s.error = e.what();
  } catch (const std::exception& e) {
    s.error = std::string("internal error: ") + e.what();
  }
  p.answer->set_value(std::move(s));
}

void EngineLoop::step() {
  // Requests whose clients left are cancelled first: their blocks serve this step.
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (it->second->cancelled()) {
      call_cancel(it->first);
      it = streams_.erase(it);
    } else {
      ++it;
    }
  }
  if (!engine_.busy()) {
    count(EngineStep{});  // the cancellations changed the counts
    return;
  }
  const EngineStep* done = nullptr;  // the engine's own, valid until its next step
  try {
    done = &call_step();
  } catch (const std::exception& e) {
    // A step that throws fails every request it held; the engine goes on with new ones. The
    // followers' steps threw the same (they hold the same logits): they hear so, and cancel the
    // same requests. A rank that hangs (TimeoutError) or a follower that cannot be told ends
    // the loop instead: the ranks no longer agree on what the engines hold.
    const bool lost = followers_ && (followers_lost_ || dynamic_cast<const TimeoutError*>(&e));
    if (!lost) (void)tell({.kind = EngineCall::Kind::kFailed});
    for (auto& [id, stream] : streams_) {
      stream->push({.token = -1, .stopped = std::nullopt, .error = e.what()});
      if (lost) {
        engine_.cancel(id);
      } else {
        call_cancel(id);
      }
    }
    streams_.clear();
    if (lost) fail(std::current_exception());
    return;
  }
  const EngineStep& out = *done;
  // Counted before any token reaches its stream: a client that has its last token (a stream's
  // [DONE]) then reads /metrics sees its sequence finished and its blocks free, never the step
  // before.
  count(out);
  for (const EngineStep::Token& t : out.tokens) {
    const auto it = std::find_if(streams_.begin(), streams_.end(),
                                 [&](const auto& s) { return s.first == t.sequence; });
    if (it == streams_.end()) continue;
    it->second->push({.token = t.id, .stopped = t.stopped, .error = {}, .logprobs = t.logprobs});
    if (t.stopped) streams_.erase(it);
  }
}

void EngineLoop::count(const EngineStep& out) {
  const Scheduler& s = engine_.scheduler();
  const std::lock_guard lock(mutex_);
  counts_.running = s.running();
  counts_.waiting = s.waiting();
  counts_.blocks_used = s.pool().used_blocks();
  counts_.blocks_free = s.pool().free_blocks();
  counts_.prefix_hit_tokens = s.prefix_hit_tokens();
  counts_.prompt_tokens += out.prefill_tokens;
  counts_.generated_tokens += static_cast<std::int64_t>(out.tokens.size());
  if (out.padded_tokens == 0) return;  // no step ran
  ++counts_.steps;
  (out.prefill_tokens > 0 ? counts_.prefill_seconds : counts_.decode_seconds) += out.seconds;
}

void EngineLoop::run() {
  for (;;) {
    std::deque<Pending> inbox;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || draining_ || !inbox_.empty() || engine_.busy() ||
               std::any_of(streams_.begin(), streams_.end(),
                           [](const auto& s) { return s.second->cancelled(); });
      });
      inbox.swap(inbox_);
      if (stopping_ || (draining_ && inbox.empty() && !engine_.busy())) {
        for (Pending& p : inbox)
          p.answer->set_value(Submitted{.stream = nullptr, .busy = true, .error = {}});
        break;
      }
    }
    for (Pending& p : inbox) apply(p);
    step();
  }
  // Stopped: whatever still runs is cancelled and told so; the followers then return.
  for (auto& [id, stream] : streams_) {
    stream->push({.token = -1, .stopped = std::nullopt, .error = "the server is shutting down"});
    engine_.cancel(id);
  }
  streams_.clear();
  (void)tell({.kind = EngineCall::Kind::kEnd});
}

}  // namespace numesh::models
