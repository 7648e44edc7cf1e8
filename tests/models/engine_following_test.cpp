// A serving engine on a mesh that spans ranks: rank 0's EngineLoop serves clients and the other
// ranks follow its calls (follow_engine), each rank a thread over make_thread_transports. The
// outcome of every request is the one one process gives it alone (greedy, sampled, stopped at a
// stop id, with log-probabilities), a client that leaves cuts its request short on every rank,
// and every rank's engine ends as rank 0's; a step that fails on every rank fails its request
// and serving goes on; the followers return when the loop drains. The calls' encoding
// round-trips every field and refuses bytes that are not a call, by name; a loop off rank 0 and
// a follower on rank 0 or one rank are refused by name.

#include "numesh/models/engine/engine_following.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/engine/engine_loop.hpp"
#include "numesh/runtime/transport.hpp"
#include "small_llama.hpp"

namespace numesh::models {
namespace {

using testing::ScratchDir;
using ::testing::ThrowsMessage;

constexpr ServingOptions kFollowedServing{
    .block_size = 4, .kv_tokens = 512, .batch_tokens = 16, .max_running = 3};

Engine load_serving(const ScratchDir& dir, runtime::DeviceMesh mesh) {
  return Engine::load(ModelSource::open(dir.path()), std::move(mesh),
                      {.context = 64, .serving = kFollowedServing});
}

// Writes a NaN over the first weight of the final norm in the folder's model.safetensors
// (its header: an 8-byte length, then JSON naming each tensor's byte range).
void poison_final_norm(const ScratchDir& dir) {
  const std::string path = (dir.path() / "model.safetensors").string();
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  std::uint64_t header_bytes = 0;
  file.read(reinterpret_cast<char*>(&header_bytes), sizeof header_bytes);
  std::string header(header_bytes, '\0');
  file.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const auto begin =
      nlohmann::json::parse(header)["model.norm.weight"]["data_offsets"][0].get<std::uint64_t>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  file.seekp(static_cast<std::streamoff>(8 + header_bytes + begin));
  file.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  ASSERT_TRUE(file.good()) << path;
}

struct ClientRequest {
  std::vector<std::int32_t> prompt;
  RequestOptions options;
};

// What a request got: its tokens, their log-probabilities (when asked), why it stopped, or
// its error.
struct Outcome {
  std::vector<std::int32_t> tokens;
  std::vector<double> logprobs;
  std::optional<StopReason> stopped;
  std::string error;
  bool operator==(const Outcome&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Outcome& o) {
  out << "tokens";
  for (std::int32_t t : o.tokens) out << ' ' << t;
  out << ", " << o.logprobs.size() << " logprobs";
  if (o.stopped) out << ", stopped " << static_cast<int>(*o.stopped);
  return out << (o.error.empty() ? "" : ", error: " + o.error);
}

// Request 2 stops at a stop id (its third token alone), request 3 asks log-probabilities, the
// odd ones sample with seeds, request 5 is long (its client leaves at once).
std::vector<ClientRequest> client_requests(std::int64_t stop_id) {
  std::vector<ClientRequest> r;
  for (int i = 0; i < 6; ++i) {
    ClientRequest q{
        {static_cast<std::int32_t>(3 + i), 7, static_cast<std::int32_t>(9 * i), 11},
        {.max_new_tokens = i == 5 ? 56 : 4 + i, .seed = static_cast<std::uint64_t>(40 + i)}};
    if (i % 2 == 1) q.options.sampling = ops::SamplingOptions{.temperature = 0.8, .top_k = 16};
    if (i == 2) q.options.stop_ids = {stop_id};
    if (i == 3) q.options.logprobs = 2;
    r.push_back(q);
  }
  return r;
}

// The requests' outcomes, each submitted alone to one engine.
std::vector<Outcome> alone(Engine& engine, const std::vector<ClientRequest>& rs) {
  std::vector<Outcome> out;
  for (const ClientRequest& r : rs) {
    const SequenceId id = engine.submit(r.prompt, r.options).value();
    Outcome o;
    while (engine.busy()) {
      for (const EngineStep::Token& t : engine.step().tokens) {
        if (t.sequence != id) continue;
        o.tokens.push_back(t.id);
        if (t.logprobs) o.logprobs.push_back(t.logprobs->logprob);
        o.stopped = t.stopped;
      }
    }
    out.push_back(o);
  }
  return out;
}

// A client on its own thread: submits, reads every event (leaving at once when `leave`).
Outcome client(EngineLoop& loop, const ClientRequest& r, bool leave = false) {
  const Submitted s = loop.submit(r.prompt, r.options);
  Outcome o;
  if (!s.stream) {
    o.error = s.busy ? "busy" : s.error;
    return o;
  }
  if (leave) s.stream->cancel();
  while (!s.stream->ended()) {
    for (const RequestStream::Event& e : s.stream->take(std::chrono::milliseconds(20))) {
      if (e.token >= 0) o.tokens.push_back(e.token);
      if (e.logprobs) o.logprobs.push_back(e.logprobs->logprob);
      if (e.stopped) o.stopped = e.stopped;
      if (!e.error.empty()) o.error = e.error;
    }
  }
  return o;
}

// How a rank's engine ended: what runs and waits, the blocks in use, the prefix-cache hits.
struct EngineState {
  std::int64_t running = -1, waiting = -1, used_blocks = -1, prefix_hits = -1;
  bool operator==(const EngineState&) const = default;
};
EngineState state_of(const Engine& e) {
  const Scheduler& s = e.scheduler();
  return {s.running(), s.waiting(), s.pool().used_blocks(), s.prefix_hit_tokens()};
}

// A mesh split over ranks: rank r holds devices[r] of its devices.
struct Split {
  std::vector<int> devices;
  std::vector<std::int64_t> dims;
  std::vector<std::string> names;
};

// Rank 0 runs an EngineLoop that `serve` drives (then drains it) while the other ranks follow;
// every rank's engine state at the end (rank 0's after the drain), each rank's error if any.
std::vector<EngineState> over_ranks(const ScratchDir& dir, const Split& split,
                                    const std::function<void(EngineLoop&)>& serve) {
  const auto transports = runtime::make_thread_transports(static_cast<int>(split.devices.size()));
  std::vector<EngineState> states(split.devices.size());
  std::vector<std::exception_ptr> errors(split.devices.size());
  std::vector<std::thread> ranks;
  for (std::size_t r = 0; r < split.devices.size(); ++r) {
    ranks.emplace_back([&, r] {
      try {
        Engine engine = load_serving(
            dir, runtime::DeviceMesh::create(
                     runtime::testing::synthetic_devices(runtime::testing::nodes(split.devices[r])),
                     transports[r], split.dims, split.names));
        if (r > 0) {
          follow_engine(engine);
          states[r] = state_of(engine);
          return;
        }
        EngineLoop loop(std::move(engine));
        serve(loop);
        loop.drain();  // the followers return now
        states[r] = state_of(loop.engine());
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
  return states;
}

TEST(EngineFollowingTest, RanksThatFollowRankZeroGiveEachRequestItsTokensAlone) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  std::vector<Outcome> want;
  std::vector<ClientRequest> rs;
  {
    Engine engine = load_serving(dir, testing::mesh_of(2, {"tp"}));
    const std::int64_t stop_id = alone(engine, client_requests(-1))[2].tokens.at(2);
    rs = client_requests(stop_id);
    want = alone(engine, rs);
  }
  ASSERT_EQ(want[2].stopped, StopReason::kStopId) << want[2];
  ASSERT_EQ(want[2].tokens.size(), 3u) << "request 2 stops at its third token";
  ASSERT_EQ(want[3].logprobs.size(), want[3].tokens.size());
  for (const Split& split : {Split{{1, 1}, {2}, {"tp"}}, Split{{1, 1, 2}, {2, 2}, {"dp", "tp"}}}) {
    SCOPED_TRACE(std::to_string(split.devices.size()) + " ranks");
    std::vector<Outcome> got(rs.size());
    const std::vector<EngineState> states = over_ranks(dir, split, [&](EngineLoop& loop) {
      std::vector<std::thread> clients;
      for (std::size_t i = 0; i < rs.size(); ++i) {
        clients.emplace_back([&, i] { got[i] = client(loop, rs[i], /*leave=*/i == 5); });
      }
      for (std::thread& c : clients) c.join();
    });
    for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
    EXPECT_LT(got[5].tokens.size(), want[5].tokens.size()) << "request 5 was cut short";
    EXPECT_EQ(std::vector<std::int32_t>(
                  want[5].tokens.begin(),
                  want[5].tokens.begin() + static_cast<std::ptrdiff_t>(got[5].tokens.size())),
              got[5].tokens)
        << "the client that left got a prefix of its tokens";
    // Every rank's engine ended as rank 0's: nothing runs or waits, every block (the cancelled
    // request's too) came back, the same prefix hits.
    EXPECT_EQ(states[0].used_blocks, 0);
    EXPECT_EQ(states[0].running, 0);
    for (std::size_t r = 1; r < states.size(); ++r) EXPECT_EQ(states[r], states[0]) << "rank " << r;
  }
}

// A step that fails on every rank alike (a sampled request's logits hold a NaN: the final
// norm's weight is poisoned) fails its request on rank 0, and the followers go on with rank 0:
// a greedy request after it gets one process's tokens, and every engine ends empty.
TEST(EngineFollowingTest, AStepThatFailsOnEveryRankFailsItsRequestsAndServingGoesOn) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  poison_final_norm(dir);
  const ClientRequest sampled{
      {3, 4, 5}, {.max_new_tokens = 4, .sampling = ops::SamplingOptions{.top_k = 8}, .seed = 1}};
  const ClientRequest greedy{{3, 4, 5}, {.max_new_tokens = 4}};
  Outcome want;
  {
    Engine engine = load_serving(dir, testing::mesh_of(2, {"tp"}));
    want = alone(engine, {greedy})[0];
  }
  Outcome failed, after;
  const std::vector<EngineState> states =
      over_ranks(dir, Split{{1, 1}, {2}, {"tp"}}, [&](EngineLoop& loop) {
        failed = client(loop, sampled);
        after = client(loop, greedy);
      });
  EXPECT_EQ(failed.error, "sampling: row 0 holds a logit of nan: nothing sound to sample from");
  EXPECT_EQ(after, want);
  EXPECT_EQ(states[1], states[0]);
  EXPECT_EQ(states[0].used_blocks, 0);
}

TEST(EngineFollowingTest, CallsRoundTripEveryField) {
  EngineCall submit{
      .kind = EngineCall::Kind::kSubmit,
      .sequence = 41,
      .prompt = {1, 2, 300000},
      .options = {.max_new_tokens = 9,
                  .stop_ids = {4, 5},
                  .sampling = ops::SamplingOptions{.temperature = 0.25, .top_k = 7, .top_p = 0.5},
                  .seed = 0xfedcba9876543210ULL,
                  .logprobs = 3}};
  const EngineCall back = decode_engine_call(encode_engine_call(submit));
  EXPECT_EQ(back.kind, EngineCall::Kind::kSubmit);
  EXPECT_EQ(back.sequence, 41);
  EXPECT_EQ(back.prompt, submit.prompt);
  EXPECT_EQ(back.options.max_new_tokens, 9);
  EXPECT_EQ(back.options.stop_ids, submit.options.stop_ids);
  ASSERT_TRUE(back.options.sampling.has_value());
  EXPECT_EQ(back.options.sampling->temperature, 0.25);
  EXPECT_EQ(back.options.sampling->top_k, 7);
  EXPECT_EQ(back.options.sampling->top_p, 0.5);
  EXPECT_EQ(back.options.seed, 0xfedcba9876543210ULL);
  EXPECT_EQ(back.options.logprobs, 3);
  const EngineCall greedy = decode_engine_call(encode_engine_call(
      {.kind = EngineCall::Kind::kSubmit, .sequence = 2, .prompt = {5}, .options = {}}));
  EXPECT_FALSE(greedy.options.sampling.has_value());
  EXPECT_FALSE(greedy.options.logprobs.has_value());
  const EngineCall cancel =
      decode_engine_call(encode_engine_call({.kind = EngineCall::Kind::kCancel, .sequence = 7}));
  EXPECT_EQ(cancel.kind, EngineCall::Kind::kCancel);
  EXPECT_EQ(cancel.sequence, 7);
}

TEST(EngineFollowingTest, BytesThatAreNotACallAreRefusedByName) {
  std::vector<std::byte> bytes = encode_engine_call(
      {.kind = EngineCall::Kind::kSubmit, .sequence = 1, .prompt = {1, 2}, .options = {}});
  EXPECT_THAT([&] { (void)decode_engine_call(std::span(bytes).first(3)); },
              ThrowsMessage<ValueError>("engine call: its mark ends past the end of its 3 bytes"));
  std::vector<std::byte> wrong = bytes;
  wrong[0] = std::byte{'X'};
  EXPECT_THAT([&] { (void)decode_engine_call(wrong); },
              ThrowsMessage<ValueError>("engine call: the bytes do not start with the mark NEC1"));
  std::vector<std::byte> kind = bytes;
  kind[4] = std::byte{9};
  EXPECT_THAT([&] { (void)decode_engine_call(kind); },
              ThrowsMessage<ValueError>("engine call: unknown kind 9"));
  // The prompt's count (after the mark, the kind and the sequence) made larger than the bytes.
  std::vector<std::byte> count = bytes;
  count[13] = std::byte{100};
  EXPECT_THAT([&] { (void)decode_engine_call(count); },
              ThrowsMessage<ValueError>(
                  ::testing::HasSubstr("engine call: 100 prompt tokens do not fit in the")));
  std::vector<std::byte> flag = bytes;  // after the mark, kind, sequence, 2 tokens, max, stops
  flag[4 + 1 + 8 + 8 + 2 * 4 + 8 + 8] = std::byte{2};
  EXPECT_THAT([&] { (void)decode_engine_call(flag); },
              ThrowsMessage<ValueError>("engine call: its sampling flag is 2, not 0 or 1"));
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THAT([&] { (void)decode_engine_call(longer); },
              ThrowsMessage<ValueError>(::testing::HasSubstr("engine call: 1 bytes left over")));
}

TEST(EngineFollowingTest, OnlyRankZeroLeadsAndOnlyOtherRanksFollow) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  Engine one = load_serving(dir, testing::mesh_of(1, {"tp"}));
  EXPECT_THAT([&] { follow_engine(one); },
              ThrowsMessage<ValueError>(
                  "follow_engine: rank 0 of a mesh over 1 rank(s) has no rank 0 to follow (ranks "
                  "1 and up of a mesh over several ranks follow rank 0)"));
  EXPECT_THAT([&] { EngineFollowers followers(one.mesh()); },
              ThrowsMessage<ValueError>(
                  "engine followers: rank 0 of a mesh over 1 rank(s) sends no calls (rank 0 of a "
                  "mesh over several ranks does)"));
  // Rank 1 of two: its engine cannot run a loop. Both ranks load (the load is collective) and
  // rank 0 then follows nobody either.
  const auto transports = runtime::make_thread_transports(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Engine engine =
          load_serving(dir, runtime::DeviceMesh::create(
                                runtime::testing::synthetic_devices(runtime::testing::nodes(1)),
                                transports[static_cast<std::size_t>(r)], {2}, {"tp"}));
      try {
        if (r == 1) {
          EngineLoop loop(std::move(engine));
        } else {
          follow_engine(engine);
        }
      } catch (const ValueError& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(errors[0],
            "follow_engine: rank 0 of a mesh over 2 rank(s) has no rank 0 to follow (ranks 1 and "
            "up of a mesh over several ranks follow rank 0)");
  EXPECT_EQ(errors[1],
            "engine followers: rank 1 of a mesh over 2 rank(s) sends no calls (rank 0 of a mesh "
            "over several ranks does)");
}

}  // namespace
}  // namespace numesh::models
