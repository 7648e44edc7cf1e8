// A serving engine on a mesh that spans ranks: rank 0's EngineLoop serves clients and the other
// ranks follow its calls (follow_engine), each rank a thread over make_thread_transports. The
// tokens every request gets are the ones one process gives it alone, greedy and sampled, with a
// client that leaves mid-way; the followers return when the loop drains. The calls' encoding
// round-trips every field and refuses bytes that are not a call, by name; a loop off rank 0 and
// a follower on rank 0 or one rank are refused by name.

#include "numesh/models/engine/engine_following.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
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

struct ClientRequest {
  std::vector<std::int32_t> prompt;
  RequestOptions options;
};

std::vector<ClientRequest> client_requests() {
  std::vector<ClientRequest> r;
  for (int i = 0; i < 6; ++i) {
    ClientRequest q{{static_cast<std::int32_t>(3 + i), 7, static_cast<std::int32_t>(9 * i), 11},
                    {.max_new_tokens = 4 + i, .seed = static_cast<std::uint64_t>(40 + i)}};
    if (i % 2 == 1) q.options.sampling = ops::SamplingOptions{.temperature = 0.8, .top_k = 16};
    if (i == 2) q.options.stop_ids = {17, 200};
    if (i == 3) q.options.logprobs = 2;
    r.push_back(q);
  }
  return r;
}

// The requests' tokens, each submitted alone to one engine.
std::vector<std::vector<std::int32_t>> tokens_alone(Engine& engine,
                                                    const std::vector<ClientRequest>& rs) {
  std::vector<std::vector<std::int32_t>> out;
  for (const ClientRequest& r : rs) {
    const SequenceId id = engine.submit(r.prompt, r.options).value();
    std::vector<std::int32_t> tokens;
    while (engine.busy()) {
      for (const EngineStep::Token& t : engine.step().tokens) {
        if (t.sequence == id) tokens.push_back(t.id);
      }
    }
    out.push_back(tokens);
  }
  return out;
}

// Rank 0 serves `rs` from a client thread each (client 5 leaves after two tokens) while the
// other ranks follow; the tokens each client got.
std::vector<std::vector<std::int32_t>> served_over_ranks(const ScratchDir& dir,
                                                         const std::vector<int>& devices,
                                                         const std::vector<std::int64_t>& dims,
                                                         const std::vector<std::string>& names,
                                                         const std::vector<ClientRequest>& rs) {
  const auto transports = runtime::make_thread_transports(static_cast<int>(devices.size()));
  std::vector<std::vector<std::int32_t>> got(rs.size());
  std::vector<std::exception_ptr> errors(devices.size());
  std::vector<std::thread> ranks;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    ranks.emplace_back([&, r] {
      try {
        runtime::DeviceMesh mesh = runtime::DeviceMesh::create(
            runtime::testing::synthetic_devices(runtime::testing::nodes(devices[r])), transports[r],
            dims, names);
        Engine engine = load_serving(dir, std::move(mesh));
        if (r > 0) {
          follow_engine(engine);
          return;
        }
        EngineLoop loop(std::move(engine));
        std::vector<std::thread> clients;
        for (std::size_t i = 0; i < rs.size(); ++i) {
          clients.emplace_back([&, i] {
            const Submitted s = loop.submit(rs[i].prompt, rs[i].options);
            ASSERT_TRUE(s.stream != nullptr) << s.error;
            while (!s.stream->ended()) {
              for (const RequestStream::Event& e : s.stream->take(std::chrono::milliseconds(20))) {
                if (e.token >= 0) got[i].push_back(e.token);
              }
              if (i == 5 && got[i].size() >= 2) s.stream->cancel();
            }
          });
        }
        for (std::thread& c : clients) c.join();
        loop.drain();  // the followers return now
        EXPECT_EQ(loop.counts().blocks_used, 0);
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
  return got;
}

TEST(EngineFollowingTest, RanksThatFollowRankZeroGiveEachRequestItsTokensAlone) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  const std::vector<ClientRequest> rs = client_requests();
  std::vector<std::vector<std::int32_t>> want;
  {
    Engine engine = load_serving(dir, testing::mesh_of(2, {"tp"}));
    want = tokens_alone(engine, rs);
  }
  struct Split {
    std::vector<int> devices;
    std::vector<std::int64_t> dims;
    std::vector<std::string> names;
  };
  for (const Split& split : {Split{{1, 1}, {2}, {"tp"}}, Split{{1, 1, 2}, {2, 2}, {"dp", "tp"}}}) {
    SCOPED_TRACE(std::to_string(split.devices.size()) + " ranks");
    const auto got = served_over_ranks(dir, split.devices, split.dims, split.names, rs);
    for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
    ASSERT_GE(got[5].size(), 2u);
    EXPECT_EQ(std::vector<std::int32_t>(want[5].begin(), want[5].begin() + 2),
              std::vector<std::int32_t>(got[5].begin(), got[5].begin() + 2))
        << "the client that left got a prefix of its tokens";
  }
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
