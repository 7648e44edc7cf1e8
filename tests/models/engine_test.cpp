// Engine: a model folder opened and loaded onto a mesh; with serving options, requests
// submitted at any time and stepped as ragged batches over the paged caches give the tokens
// each gives alone (batch invariance: greedy and seeded sampling), whatever runs beside them
// and however their prompts were chunked; cancelled and finished requests give their blocks
// back; every bad call is refused naming what is wrong.

#include "numesh/models/engine/engine.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/engine/engine_loop.hpp"
#include "numesh/models/formats/safetensors_checkpoint.hpp"
#include "numesh/models/hf/random_model.hpp"
#include "numesh/models/lm/causal_lm.hpp"
#include "numesh/models/lm/generation.hpp"
#include "safetensors_writer.hpp"
#include "small_llama.hpp"

namespace numesh::models {
namespace {

using ::testing::HasSubstr;
using testing::mesh_of;
using testing::ScratchDir;
using ::testing::ThrowsMessage;

Engine serving_engine(const ScratchDir& dir, runtime::DeviceMesh mesh, ServingOptions serving) {
  return Engine::load(ModelSource::open(dir.path()), std::move(mesh),
                      {.context = 64, .serving = serving});
}

struct Request {
  std::vector<std::int32_t> prompt;
  RequestOptions options;
};

// Submits requests[i] at step arrival[i] (all at once when empty) and steps until all finish;
// each request's tokens in submission order.
std::vector<std::vector<std::int32_t>> serve(Engine& engine, const std::vector<Request>& requests,
                                             const std::vector<int>& arrival = {}) {
  std::vector<std::vector<std::int32_t>> out(requests.size());
  std::map<SequenceId, std::size_t> index;
  std::size_t next = 0;
  for (int step = 0; next < requests.size() || engine.busy(); ++step) {
    while (next < requests.size() && (arrival.empty() || arrival[next] <= step)) {
      const std::optional<SequenceId> id =
          engine.submit(requests[next].prompt, requests[next].options);
      if (!id) break;  // the queue is full: try again next step
      index[*id] = next++;
    }
    const EngineStep s = engine.step();
    for (const EngineStep::Token& t : s.tokens) out[index.at(t.sequence)].push_back(t.id);
    EXPECT_LT(step, 1000) << "the engine stalls";
    if (step >= 1000) break;
  }
  return out;
}

std::vector<Request> sixteen_requests() {
  std::mt19937 rng(21);
  std::vector<Request> r;
  for (int i = 0; i < 16; ++i) {
    Request q;
    const int length = 1 + static_cast<int>(rng() % 40);
    // A shared prefix for half of them (prefix caching is then hit).
    if (i % 2 == 0) q.prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    for (int j = 0; j < length; ++j) q.prompt.push_back(static_cast<std::int32_t>(rng() % 256));
    q.options.max_new_tokens = 1 + static_cast<std::int64_t>(rng() % 10);
    if (i % 3 == 1) {
      q.options.sampling = ops::SamplingOptions{.temperature = 0.9, .top_k = 20, .top_p = 0.95};
      q.options.seed = 1000 + static_cast<std::uint64_t>(i);
    }
    r.push_back(q);
  }
  return r;
}

TEST(EngineTest, RequestsGiveTheSameTokensAloneAndTogetherArrivingAtAnyTime) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  const std::vector<Request> requests = sixteen_requests();
  for (const int n : {1, 2}) {
    SCOPED_TRACE(std::to_string(n) + " devices");
    const ServingOptions serving{
        .block_size = 4, .kv_tokens = 1024, .batch_tokens = 32, .max_running = 6};
    std::vector<std::vector<std::int32_t>> alone;
    {
      Engine engine = serving_engine(dir, mesh_of(n, {"tp"}), serving);
      for (const Request& r : requests) alone.push_back(serve(engine, {r}).front());
    }
    Engine engine = serving_engine(dir, mesh_of(n, {"tp"}), serving);
    const std::int64_t compiled = engine.compiled_programs();
    std::vector<int> arrival;
    for (std::size_t i = 0; i < requests.size(); ++i)
      arrival.push_back(static_cast<int>(i % 5) * 2);
    const auto together = serve(engine, requests, arrival);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(together[i], alone[i]) << "request " << i;
      EXPECT_EQ(static_cast<std::int64_t>(alone[i].size()), requests[i].options.max_new_tokens);
    }
    EXPECT_GT(engine.scheduler().prefix_hit_tokens(), 0);
    EXPECT_EQ(engine.scheduler().pool().used_blocks(), 0) << "every block came back";
    EXPECT_EQ(engine.compiled_programs(), compiled)
        << "load compiled every step size: serving compiled nothing more";
  }
}

// One step's tokens as a ragged batch: (sequence's table, first position, ids) parts, then
// padding up to `padded` tokens.
struct Part {
  std::vector<std::int32_t> table;
  std::int64_t first;
  std::vector<std::int32_t> ids;
};
std::pair<std::vector<std::int32_t>, ops::RaggedBatch> ragged(const std::vector<Part>& parts,
                                                              std::int64_t padded) {
  constexpr std::int64_t kBlock = 4;
  std::vector<std::int32_t> ids;
  ops::RaggedBatch b;
  b.max_context = 32;
  for (const Part& p : parts) {
    const auto at = static_cast<std::int64_t>(b.tables.size());
    b.tables.insert(b.tables.end(), p.table.begin(), p.table.end());
    for (std::size_t i = 0; i < p.ids.size(); ++i) {
      const std::int64_t pos = p.first + static_cast<std::int64_t>(i);
      ids.push_back(p.ids[i]);
      b.positions.push_back(pos);
      b.slots.push_back(p.table[static_cast<std::size_t>(pos / kBlock)] * kBlock + pos % kBlock);
      b.context.push_back(pos + 1);
      b.table_of.push_back(at);
    }
  }
  b.tables.push_back(0);
  while (static_cast<std::int64_t>(ids.size()) < padded) {
    ids.push_back(0);
    b.positions.push_back(0);
    b.slots.push_back(0);
    b.context.push_back(1);
    b.table_of.push_back(static_cast<std::int64_t>(b.tables.size()) - 1);
  }
  return {ids, b};
}

// The claim docs/serving.md makes: a token's logits are the same bits whatever step it runs in
// (alone, in a prompt chunk of another size, beside other sequences' prefill and decode tokens,
// padded to another size, in other blocks). Products in kRowInvariant, attention per token.
TEST(EngineTest, ATokensLogitsAreTheSameBitsWhateverStepItRunsIn) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  const HfConfig config = HfConfig::load(dir.path());
  const ops::PagedCacheOptions paged{.blocks = 16, .block_size = 4, .max_context = 32};
  const std::vector<std::int32_t> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const std::vector<std::int32_t> other{7, 7, 8, 9, 10};
  for (const int n : {1, 2}) {
    SCOPED_TRACE(std::to_string(n) + " devices");
    const auto load = [&] {
      return CausalLm::load(mesh_of(n, {"tp"}), config, SafetensorsCheckpoint::open(dir.path()),
                            paged);
    };
    // The prompt alone in one chunk, then one decode token.
    CausalLm a = load();
    const auto [ids1, b1] = ragged({{{1, 2, 3}, 0, prompt}}, 32);
    const runtime::HostTensor alone = a.ragged_logits(ids1, b1, std::vector<std::int64_t>{9});
    const auto [ids2, b2] = ragged({{{1, 2, 3}, 10, {42}}}, 1);
    const runtime::HostTensor alone_next = a.ragged_logits(ids2, b2, std::vector<std::int64_t>{0});
    // The prompt in chunks of 3 and 7 among another sequence's tokens, in other blocks, padded.
    CausalLm t = load();
    const std::vector<std::int32_t> head(prompt.begin(), prompt.begin() + 3),
        tail(prompt.begin() + 3, prompt.end());
    const auto [ids3, b3] = ragged({{{5, 4, 8}, 0, other}, {{9, 7, 6}, 0, head}}, 24);
    (void)t.ragged_logits(ids3, b3, std::vector<std::int64_t>{4});
    const auto [ids4, b4] = ragged({{{5, 4, 8}, 5, {11}}, {{9, 7, 6}, 3, tail}}, 8);
    const runtime::HostTensor together = t.ragged_logits(ids4, b4, std::vector<std::int64_t>{0, 7});
    const auto [ids5, b5] = ragged({{{9, 7, 6}, 10, {42}}, {{5, 4, 8}, 6, {12}}}, 4);
    const runtime::HostTensor together_next =
        t.ragged_logits(ids5, b5, std::vector<std::int64_t>{0, 1});
    const auto row = [](const runtime::HostTensor& l, std::int64_t r) {
      const std::int64_t v = l.shape[1];
      return std::vector<float>(l.data.begin() + r * v, l.data.begin() + (r + 1) * v);
    };
    EXPECT_EQ(row(together, 1), row(alone, 0)) << "the prompt's last token";
    EXPECT_EQ(row(together_next, 0), row(alone_next, 0)) << "the first decode token";
  }
}

TEST(EngineTest, GreedyRequestsGiveWhatGenerateGives) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  const std::vector<std::vector<std::int32_t>> prompts{{3, 40, 5}, {9, 200, 1, 2, 3, 4, 5}, {11}};
  Engine engine = serving_engine(dir, mesh_of(2, {"tp"}),
                                 {.block_size = 4, .kv_tokens = 256, .batch_tokens = 16});
  std::vector<Request> requests;
  for (const auto& p : prompts) requests.push_back({p, {.max_new_tokens = 6}});
  const auto served = serve(engine, requests);
  const HfConfig config = HfConfig::load(dir.path());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CausalLm one =
        CausalLm::load(mesh_of(1, {"tp"}), config, SafetensorsCheckpoint::open(dir.path()), 1, 16);
    std::mt19937_64 rng(0);
    const GenerationResult g = generate(one, {prompts[i]}, {.max_new_tokens = 6}, rng);
    EXPECT_EQ(std::vector<std::int64_t>(served[i].begin(), served[i].end()), g.ids[0])
        << "prompt " << i;
  }
}

// Each token's log-probabilities, keyed by request, as serve() keys its tokens.
std::vector<std::vector<TokenLogprobs>> serve_logprobs(Engine& engine,
                                                       const std::vector<Request>& requests) {
  std::vector<std::vector<TokenLogprobs>> out(requests.size());
  std::map<SequenceId, std::size_t> index;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    index[*engine.submit(requests[i].prompt, requests[i].options)] = i;
  }
  for (int step = 0; engine.busy() && step < 1000; ++step) {
    for (const EngineStep::Token& t : engine.step().tokens) {
      if (t.logprobs) out[index.at(t.sequence)].push_back(*t.logprobs);
    }
  }
  return out;
}

TEST(EngineTest, LogprobsAreTheLogSoftmaxOfTheModelsLogits) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  const HfConfig config = HfConfig::load(dir.path());
  const std::vector<std::int32_t> prompt{3, 40, 5, 17};
  const auto sampled = ops::SamplingOptions{.temperature = 1.3, .top_k = 30, .top_p = 0.9};
  const std::vector<Request> requests{
      {prompt, {.max_new_tokens = 5, .logprobs = 5}},
      {prompt, {.max_new_tokens = 5, .sampling = sampled, .seed = 7, .logprobs = 3}},
      {{9, 9, 9}, {.max_new_tokens = 4}}};  // beside them, asking for none
  // Two devices split the vocabulary: each row's normaliser is combined from both.
  for (const int devices : {1, 2}) {
    Engine engine = serving_engine(dir, mesh_of(devices, {"tp"}),
                                   {.block_size = 4, .kv_tokens = 128, .batch_tokens = 8});
    const auto tokens = serve(engine, requests);
    const auto scores = serve_logprobs(engine, requests);
    EXPECT_TRUE(scores[2].empty()) << "a request that asks for none gets none";
    for (std::size_t r = 0; r < 2; ++r) {
      ASSERT_EQ(scores[r].size(), tokens[r].size()) << "request " << r;
      // The reference: the dense model's logits over prompt + tokens, log-softmax in double.
      std::vector<std::int32_t> ids = prompt;
      ids.insert(ids.end(), tokens[r].begin(), tokens[r].end() - 1);
      CausalLm one = CausalLm::load(mesh_of(1, {"tp"}), config,
                                    SafetensorsCheckpoint::open(dir.path()), 1, 16);
      const auto n = static_cast<std::int64_t>(ids.size());
      const runtime::HostTensor logits = one.logits(ids, n, 0);
      const std::int64_t vocab = logits.shape[1];
      for (std::size_t i = 0; i < tokens[r].size(); ++i) {
        const std::int64_t row =
            static_cast<std::int64_t>(prompt.size()) - 1 + static_cast<std::int64_t>(i);
        const float* l = logits.data.data() + row * vocab;
        double m = l[0], sum = 0;
        for (std::int64_t v = 1; v < vocab; ++v) m = std::max<double>(m, l[v]);
        for (std::int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(l[v]) - m);
        const double lse = m + std::log(sum);
        const TokenLogprobs& got = scores[r][i];
        EXPECT_NEAR(got.logprob, l[tokens[r][i]] - lse, 1e-4) << "request " << r << " token " << i;
        std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return l[a] > l[b]; });
        ASSERT_EQ(got.top.size(), r == 0 ? 5U : 3U);
        for (std::size_t k = 0; k < got.top.size(); ++k) {
          EXPECT_EQ(got.top[k].first, order[k])
              << "request " << r << " token " << i << " rank " << k;
          EXPECT_NEAR(got.top[k].second, l[order[k]] - lse, 1e-4);
        }
        if (r == 0) {
          EXPECT_EQ(got.top[0].first, tokens[r][i]) << "greedy picks the most likely";
        }
      }
    }
    // Alone, the same request's log-probabilities are the same bits.
    const auto alone = serve_logprobs(engine, {requests[0]});
    for (std::size_t i = 0; i < alone[0].size(); ++i) {
      EXPECT_EQ(alone[0][i].logprob, scores[0][i].logprob) << "token " << i;
      EXPECT_EQ(alone[0][i].top, scores[0][i].top) << "token " << i;
    }
  }
}

TEST(EngineTest, StopIdsCancellationAndAFullQueue) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  Engine engine = serving_engine(
      dir, mesh_of(1, {"tp"}),
      {.block_size = 4, .kv_tokens = 64, .batch_tokens = 8, .max_running = 2, .max_waiting = 1});
  const std::vector<std::int32_t> alone =
      serve(engine, {{{1, 2, 3}, {.max_new_tokens = 5}}}).front();
  // Stopping at its second token's id.
  const auto stopped =
      serve(engine, {{{1, 2, 3}, {.max_new_tokens = 5, .stop_ids = {alone[1]}}}}).front();
  EXPECT_EQ(stopped, std::vector<std::int32_t>(alone.begin(), alone.begin() + 2));
  // Cancelled while running, and while waiting: the blocks come back at once.
  const SequenceId a = *engine.submit({1, 2, 3, 4, 5, 6, 7}, {.max_new_tokens = 8});
  EXPECT_FALSE(engine.submit({1}, {}).has_value()) << "max_waiting 1";
  (void)engine.step();
  const SequenceId b = *engine.submit({9, 9}, {});
  engine.cancel(a);
  engine.cancel(b);
  EXPECT_FALSE(engine.busy());
  EXPECT_EQ(engine.scheduler().pool().used_blocks(), 0);
  EXPECT_TRUE(engine.step().tokens.empty()) << "an idle step does nothing";
}

// EngineLoop: requests submitted from several threads at once, each read from its own stream,
// give the tokens the engine gives each alone; one client leaves mid-way and its blocks come
// back; a bad request is refused with the engine's message; drain lets the rest finish.
TEST(EngineLoopTest, ClientsOnTheirOwnThreadsGetWhatEachGetsAlone) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  const ServingOptions serving{
      .block_size = 4, .kv_tokens = 512, .batch_tokens = 16, .max_running = 3};
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back({{static_cast<std::int32_t>(3 + i), 7, static_cast<std::int32_t>(9 * i)},
                        {.max_new_tokens = 5 + i, .seed = static_cast<std::uint64_t>(i)}});
  }
  std::vector<std::vector<std::int32_t>> alone;
  {
    Engine engine = serving_engine(dir, mesh_of(2, {"tp"}), serving);
    for (const Request& r : requests) alone.push_back(serve(engine, {r}).front());
  }
  EngineLoop loop(serving_engine(dir, mesh_of(2, {"tp"}), serving));
  // Before any step, the counts already say every block is free (512 tokens in blocks of 4; the
  // padding block is apart).
  EXPECT_EQ(loop.counts().blocks_free, 512 / 4);
  EXPECT_EQ(loop.counts().blocks_used, 0);
  std::vector<std::vector<std::int32_t>> got(requests.size());
  std::vector<std::thread> clients;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      const Submitted s = loop.submit(requests[i].prompt, requests[i].options);
      ASSERT_TRUE(s.stream != nullptr) << s.error;
      while (!s.stream->ended()) {
        for (const RequestStream::Event& e : s.stream->take(std::chrono::milliseconds(20))) {
          if (e.token >= 0) got[i].push_back(e.token);
        }
        if (i == 5 && got[i].size() >= 2) s.stream->cancel();  // this client leaves
      }
    });
  }
  const Submitted bad = loop.submit({1, 256}, {});
  EXPECT_EQ(bad.stream, nullptr);
  EXPECT_EQ(bad.error,
            "submit: token 256 at position 1 is outside the model's vocabulary [0, 256)");
  for (std::thread& t : clients) t.join();
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], alone[i]) << "request " << i;
  EXPECT_GE(got[5].size(), 2u);
  EXPECT_EQ(std::vector<std::int32_t>(
                alone[5].begin(), alone[5].begin() + static_cast<std::ptrdiff_t>(got[5].size())),
            got[5])
      << "the client that left got a prefix of its tokens";
  loop.drain();
  const EngineCounts c = loop.counts();
  EXPECT_EQ(c.running, 0);
  EXPECT_EQ(c.waiting, 0);
  EXPECT_EQ(c.blocks_used, 0) << "every block came back, the cancelled request's included";
  EXPECT_EQ(c.blocks_free, 512 / 4);
  EXPECT_TRUE(loop.submit({1}, {}).busy) << "a drained loop takes no request";
  EXPECT_THAT(
      [&] {
        EngineLoop(
            Engine::load(ModelSource::open(dir.path()), mesh_of(1, {"tp"}), {.context = 16}));
      },
      ThrowsMessage<ValueError>("engine: scheduler needs an engine loaded with serving options"));
}

TEST(EngineTest, BadCallsAreRefusedByName) {
  ScratchDir dir;
  testing::write_small_llama(dir);
  Engine dense = Engine::load(ModelSource::open(dir.path()), mesh_of(1, {"tp"}), {.context = 16});
  EXPECT_THAT(
      [&] { (void)dense.submit({1}, {}); },
      ThrowsMessage<ValueError>("engine: submit needs an engine loaded with serving options"));
  EXPECT_THAT(
      [&] { (void)dense.step(); },
      ThrowsMessage<ValueError>("engine: step needs an engine loaded with serving options"));
  EXPECT_FALSE(dense.busy());
  EXPECT_THAT(
      [&] {
        (void)Engine::load(ModelSource::open(dir.path()), mesh_of(1, {"tp"}), {.sequences = 0});
      },
      ThrowsMessage<ValueError>("engine: sequences 0 must be positive"));
  EXPECT_THAT(
      [&] {
        (void)Engine::load(ModelSource::open(dir.path()), mesh_of(1, {"tp"}), {.prefill_chunk = 0});
      },
      ThrowsMessage<ValueError>(
          "engine: prefill_chunk 0 must be positive (the most tokens a run takes)"));
  EXPECT_THAT(
      [&] {
        (void)Engine::load(ModelSource::open(dir.path()), mesh_of(1, {"tp"}), {.context = 5000});
      },
      ThrowsMessage<ValueError>(HasSubstr("engine: context 5000 must be 0")));
  Engine engine = serving_engine(dir, mesh_of(1, {"tp"}),
                                 {.kv_tokens = 64, .batch_tokens = 8, .max_running = 2});
  EXPECT_THAT(
      [&] {
        (void)engine.submit({1, 256}, {});
      },
      ThrowsMessage<IndexError>(
          "submit: token 256 at position 1 is outside the model's vocabulary [0, 256)"));
  EXPECT_THAT(
      [&] { (void)engine.submit({1}, {.sampling = ops::SamplingOptions{.top_k = 65}}); },
      ThrowsMessage<ValueError>(
          "submit: top_k 65 is more than the 64 candidates the engine brings back per device"));
  EXPECT_THAT([&] { (void)engine.submit({}, {}); },
              ThrowsMessage<ShapeError>("add: the prompt is empty"));
  EXPECT_THAT([&] { (void)engine.submit({1}, {.logprobs = 21}); },
              ThrowsMessage<ValueError>(HasSubstr("submit: logprobs 21 must be between 0 and 20")));
  EXPECT_THAT([&] { (void)engine.submit({1}, {.logprobs = -1}); },
              ThrowsMessage<ValueError>(HasSubstr("submit: logprobs -1 must be between 0 and 20")));
  EXPECT_THAT([&] { (void)engine.submit({1}, {.max_new_tokens = 65}); },
              ThrowsMessage<ValueError>(HasSubstr("past the 64 a sequence may take")));
  EXPECT_THAT([&] { engine.cancel(3); },
              ThrowsMessage<KeyError>("cancel: no request 3 (never submitted, or finished)"));
  EXPECT_FALSE(engine.busy()) << "nothing refused was queued";
}

}  // namespace
}  // namespace numesh::models
