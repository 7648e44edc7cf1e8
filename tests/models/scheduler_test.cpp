// BlockPool and Scheduler without a model: a fake model writes each computed token into its
// KV slot (block, offset) as the block tables say, reads a sequence's whole context back
// through its block table, and picks the next token from what it read. So a wrong block table,
// a reused prefix that does not hold the prompt's tokens, or a chunk that skips or repeats a
// token changes the tokens; a sequence must generate what it generates alone, however it was
// scheduled. Every bad call is refused naming what is wrong.

#include "numesh/models/engine/scheduler.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "numesh/core/error.hpp"

namespace numesh::models {
namespace {

using ::testing::ThrowsMessage;

TEST(BlockPoolTest, HandsOutCountsAndTakesBackInEvictionOrder) {
  BlockPool pool(5);
  EXPECT_EQ(pool.blocks(), 5);
  EXPECT_EQ(pool.free_blocks(), 4) << "block 0 is the scratch block";
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.allocate(3, a));
  EXPECT_EQ(a, (std::vector<BlockId>{1, 2, 3}));
  std::vector<BlockId> more{9};
  EXPECT_FALSE(pool.allocate(2, more)) << "one is free";
  EXPECT_EQ(more, std::vector<BlockId>{9}) << "a refused allocation appends nothing";
  EXPECT_EQ(pool.free_blocks(), 1) << "a refused allocation takes nothing";
  EXPECT_EQ(pool.used_blocks(), 3);
  // Published prefixes are found, and a hit holds the block once more.
  pool.publish(1, 111);
  pool.publish(2, 222);
  EXPECT_EQ(pool.cached_blocks(), 2);
  EXPECT_EQ(pool.hit(222), std::optional<BlockId>(2));
  EXPECT_EQ(pool.ref_count(2), 2);
  EXPECT_FALSE(pool.hit(333).has_value());
  // Released last to first: 3, 2 (still held once), 1; free order 4, 3, 1.
  pool.release(a);
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.free_blocks(), 3);
  // A free block keeps its prefix: a hit takes it off the free list.
  EXPECT_EQ(pool.hit(111), std::optional<BlockId>(1));
  EXPECT_EQ(pool.free_blocks(), 2);
  pool.release(std::vector<BlockId>{1, 2});
  // Eviction: the least recently released go first, and forget their prefix.
  std::vector<BlockId> b;
  ASSERT_TRUE(pool.allocate(2, b));
  EXPECT_EQ(b, (std::vector<BlockId>{4, 3}));
  ASSERT_TRUE(pool.allocate(1, b));
  EXPECT_EQ(b, (std::vector<BlockId>{4, 3, 2})) << "appended";
  EXPECT_FALSE(pool.hit(222).has_value()) << "block 2 was handed out again";
  EXPECT_EQ(pool.hit(111), std::optional<BlockId>(1));
  EXPECT_EQ(pool.cached_blocks(), 1);
}

// Many rounds of publishing, evicting and hitting (more erased entries than the index has
// slots, so it is rebuilt in place several times) agree with a plain map of the same events.
TEST(BlockPoolTest, ThePrefixIndexAgreesWithAMapOverManyEvictions) {
  BlockPool pool(9);
  std::map<BlockHash, BlockId> want;
  std::mt19937_64 rng(4);
  std::vector<BlockId> held;
  for (int round = 0; round < 2000; ++round) {
    held.clear();
    ASSERT_TRUE(pool.allocate(3, held));
    for (auto it = want.begin(); it != want.end();) {  // handed out again: forgotten
      it = std::find(held.begin(), held.end(), it->second) != held.end() ? want.erase(it)
                                                                         : std::next(it);
    }
    for (const BlockId b : held) {
      const BlockHash h = rng() % 64;  // collisions of hashes and of slots alike
      pool.publish(b, h);
      want.emplace(h, b);  // the first publisher keeps a hash
    }
    pool.release(held);
    ASSERT_EQ(pool.cached_blocks(), static_cast<std::int64_t>(want.size())) << "round " << round;
    for (BlockHash h = 0; h < 64; ++h) {
      const auto w = want.find(h);
      const std::optional<BlockId> got = pool.hit(h);
      ASSERT_EQ(got.has_value(), w != want.end()) << "hash " << h << ", round " << round;
      if (got) {
        ASSERT_EQ(*got, w->second);
        pool.release(std::vector<BlockId>{*got});
      }
    }
  }
}

TEST(BlockPoolTest, BadCallsAreRefusedByNameAndChangeNothing) {
  EXPECT_THAT([] { BlockPool(1); },
              ThrowsMessage<ValueError>(
                  "block pool: 1 blocks; it needs the scratch block and at least one more"));
  BlockPool pool(4);
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.allocate(2, a));
  EXPECT_THAT(
      [&] {
        pool.release(std::vector<BlockId>{1, 3});
      },
      ThrowsMessage<IndexError>("release: block 3 is not held"));
  EXPECT_THAT(
      [&] {
        pool.release(std::vector<BlockId>{2, 2});
      },
      ThrowsMessage<IndexError>("release: block 2 is held 1 times, released 2"));
  EXPECT_THAT([&] { pool.release(std::vector<BlockId>{0}); },
              ThrowsMessage<IndexError>("release: block 0 is outside [1, 4)"));
  EXPECT_THAT([&] { pool.publish(3, 7); },
              ThrowsMessage<IndexError>("publish: block 3 is not held"));
  EXPECT_THAT([&] { (void)pool.ref_count(4); },
              ThrowsMessage<IndexError>("ref_count: block 4 is outside [1, 4)"));
  EXPECT_THAT([&] { (void)pool.allocate(-1, a); },
              ThrowsMessage<ValueError>("allocate: -1 blocks"));
  EXPECT_EQ(pool.ref_count(1), 1);
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.free_blocks(), 1);
  pool.release(a);
  EXPECT_EQ(pool.free_blocks(), 3);
}

TEST(BlockHashTest, DependsOnThePrefixAndEveryToken) {
  const std::vector<std::int32_t> t{1, 2, 3, 4};
  const BlockHash h = block_hash(0, t);
  EXPECT_EQ(h, block_hash(0, t));
  EXPECT_NE(h, block_hash(1, t));
  EXPECT_NE(h, block_hash(0, std::vector<std::int32_t>{1, 2, 4, 3}));
  EXPECT_NE(h, block_hash(0, std::vector<std::int32_t>{1, 2, 3}));
}

// The fake model: a KV cache of token ids, slots [blocks, block_size].
class FakeModel {
 public:
  FakeModel(std::int64_t blocks, std::int64_t block_size)
      : block_size_(block_size), slots_(static_cast<std::size_t>(blocks * block_size), -1) {}

  // Runs `step`: writes each chunk's tokens into their slots, then, for a sampling chunk, reads
  // the sequence's context back through its block table and picks the next token from it.
  std::vector<std::int32_t> run(const Scheduler& s, const ScheduledStep& step) {
    std::vector<std::int32_t> sampled;
    for (const ScheduledChunk& c : step.chunks) {
      const std::vector<std::int32_t>& tokens = s.tokens(c.sequence);
      const std::span<const BlockId> table = s.block_table(c.sequence);
      for (std::int64_t p = c.start; p < c.start + c.count; ++p) {
        slot(table, p) = tokens[static_cast<std::size_t>(p)];
      }
      if (!c.sample) continue;
      std::uint64_t h = 7;
      for (std::int64_t p = 0; p < c.start + c.count; ++p) h = h * 31 + slot(table, p) + 1;
      sampled.push_back(static_cast<std::int32_t>(h % 50));
    }
    return sampled;
  }

 private:
  std::int32_t& slot(std::span<const BlockId> table, std::int64_t position) {
    const auto index = static_cast<std::size_t>(position / block_size_);
    if (index >= table.size()) throw std::out_of_range("the block table is too short");
    const BlockId block = table[index];
    return slots_[static_cast<std::size_t>(block * block_size_ + position % block_size_)];
  }
  std::int64_t block_size_;
  std::vector<std::int32_t> slots_;
};

// What `prompt` generates alone on a roomy scheduler: max_new tokens.
std::vector<std::int32_t> alone(const std::vector<std::int32_t>& prompt, std::int64_t max_new) {
  Scheduler s({.block_size = 4, .blocks = 64, .batch_tokens = 8, .max_running = 1});
  FakeModel model(64, 4);
  const SequenceId id = *s.add(prompt, max_new);
  while (s.generated(id) < max_new) {
    const ScheduledStep step = s.schedule();
    s.complete(step, model.run(s, step));
  }
  return std::vector<std::int32_t>(
      s.tokens(id).begin() + static_cast<std::ptrdiff_t>(prompt.size()), s.tokens(id).end());
}

TEST(SchedulerTest, ChunksDecodesFirstAndPrefillsUnderTheBudget) {
  Scheduler s({.block_size = 4, .blocks = 32, .batch_tokens = 6, .max_running = 3});
  FakeModel model(32, 4);
  const SequenceId a = *s.add({1, 2, 3}, 4);
  const SequenceId b = *s.add(std::vector<std::int32_t>(13, 5), 2);
  ScheduledStep step = s.schedule();
  ASSERT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(step.chunks[0].count, 3);
  EXPECT_TRUE(step.chunks[0].sample);
  EXPECT_EQ(step.chunks[1].sequence, b);
  EXPECT_EQ(step.chunks[1].count, 3) << "the budget's rest";
  EXPECT_FALSE(step.chunks[1].sample);
  s.complete(step, model.run(s, step));
  // a decodes in every step while b's prompt goes in chunks of the budget's rest.
  for (const std::int64_t chunk : {5, 5}) {
    step = s.schedule();
    ASSERT_EQ(step.chunks.size(), 2u);
    EXPECT_EQ(step.chunks[0].sequence, a);
    EXPECT_EQ(step.chunks[0].count, 1);
    EXPECT_EQ(step.chunks[1].count, chunk);
    EXPECT_EQ(step.chunks[1].sample, chunk == 5 && s.computed(b) + chunk == 13);
    s.complete(step, model.run(s, step));
  }
  EXPECT_EQ(s.computed(b), 13);
  EXPECT_EQ(s.generated(b), 1);
  EXPECT_EQ(s.block_table(b).size(), 4u) << "13 tokens in blocks of 4";
}

TEST(SchedulerTest, EverySequenceGeneratesWhatItGeneratesAloneAndEveryBlockComesBack) {
  std::mt19937_64 rng(11);
  // Prompts of 1 to 40 tokens, half of them starting with one of two shared prefixes (a system
  // prompt, a conversation's earlier turn), so that the prefix cache is hit and missed.
  const std::vector<std::vector<std::int32_t>> prefixes{std::vector<std::int32_t>(12, 9),
                                                        {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}};
  struct Request {
    std::vector<std::int32_t> prompt;
    std::int64_t max_new;
    bool cancelled;
  };
  std::vector<Request> requests;
  for (int i = 0; i < 60; ++i) {
    Request r;
    if (i % 2 == 0) r.prompt = prefixes[static_cast<std::size_t>(i / 2 % 2)];
    const auto extra = static_cast<int>(rng() % 30) + (r.prompt.empty() ? 1 : 0);
    for (int j = 0; j < extra; ++j) r.prompt.push_back(static_cast<std::int32_t>(rng() % 50));
    r.max_new = 1 + static_cast<std::int64_t>(rng() % 12);
    r.cancelled = rng() % 7 == 0;
    requests.push_back(r);
  }
  for (const bool prefix_caching : {true, false}) {
    SCOPED_TRACE(prefix_caching ? "prefix caching" : "no prefix caching");
    Scheduler s({.block_size = 4,
                 .blocks = 24,
                 .batch_tokens = 10,
                 .max_running = 4,
                 .max_waiting = 8,
                 .max_context = 64,
                 .prefix_caching = prefix_caching});
    FakeModel model(24, 4);
    std::map<SequenceId, std::size_t> request_of;
    std::size_t next = 0, done = 0, refused = 0;
    std::int64_t steps = 0;
    while (done < requests.size()) {
      // Arrivals: up to three a step, until the queue says busy.
      for (int k = 0; k < 3 && next < requests.size(); ++k) {
        const std::optional<SequenceId> id = s.add(requests[next].prompt, requests[next].max_new);
        if (!id) {
          ++refused;
          break;
        }
        request_of[*id] = next++;
      }
      const ScheduledStep step = s.schedule();
      ASSERT_LE(step.tokens(), 10);
      std::set<SequenceId> seen;
      for (const ScheduledChunk& c : step.chunks) {
        EXPECT_TRUE(seen.insert(c.sequence).second) << "one chunk a sequence";
      }
      s.complete(step, model.run(s, step));
      ++steps;
      // Every held block is held by as many sequences as list it.
      std::map<BlockId, std::int32_t> holders;
      for (const auto& [id, r] : request_of) {
        for (const BlockId b : s.block_table(id)) ++holders[b];
        EXPECT_GE(static_cast<std::int64_t>(s.block_table(id).size()) * 4, s.computed(id));
      }
      for (const auto& [b, n] : holders) EXPECT_EQ(s.pool().ref_count(b), n) << "block " << b;
      // Finished ones leave; a cancelled one leaves after its first token.
      for (auto it = request_of.begin(); it != request_of.end();) {
        const Request& r = requests[it->second];
        const std::int64_t generated = s.generated(it->first);
        if (generated >= r.max_new || (r.cancelled && generated >= 1)) {
          if (!r.cancelled) {
            const std::vector<std::int32_t>& t = s.tokens(it->first);
            EXPECT_EQ(std::vector<std::int32_t>(
                          t.begin() + static_cast<std::ptrdiff_t>(r.prompt.size()), t.end()),
                      alone(r.prompt, r.max_new))
                << "request " << it->second;
          }
          s.finish(it->first);
          it = request_of.erase(it);
          ++done;
        } else {
          ++it;
        }
      }
      ASSERT_LT(steps, 10000) << "the scheduler stalls";
    }
    EXPECT_GT(refused, 0u) << "the queue limit was reached";
    EXPECT_EQ(s.waiting(), 0);
    EXPECT_EQ(s.running(), 0);
    EXPECT_EQ(s.pool().free_blocks(), 23) << "every block came back";
    if (prefix_caching) {
      EXPECT_GT(s.prefix_hit_tokens(), 0) << "shared prefixes were reused";
    } else {
      EXPECT_EQ(s.prefix_hit_tokens(), 0);
    }
  }
}

TEST(SchedulerTest, APromptReusesTheCachedFullBlocksOfAnEarlierOne) {
  Scheduler s({.block_size = 4, .blocks = 16, .batch_tokens = 32, .max_running = 2});
  FakeModel model(16, 4);
  const auto run = [&](const std::vector<std::int32_t>& prompt) {
    const SequenceId id = *s.add(prompt, 2);
    const ScheduledStep first = s.schedule();
    EXPECT_EQ(first.chunks.size(), 1u);
    s.complete(first, model.run(s, first));
    while (s.generated(id) < 2) {
      const ScheduledStep step = s.schedule();
      s.complete(step, model.run(s, step));
    }
    return std::pair(id, first.chunks.front());
  };
  std::vector<std::int32_t> shared(12);
  for (std::size_t i = 0; i < shared.size(); ++i) shared[i] = static_cast<std::int32_t>(i + 20);
  std::vector<std::int32_t> a_prompt = shared, b_prompt = shared;
  a_prompt.push_back(1);
  b_prompt.insert(b_prompt.end(), {2, 3});
  const auto [a, a_first] = run(a_prompt);
  EXPECT_EQ(a_first.start, 0);
  const std::vector<BlockId> a_blocks(s.block_table(a).begin(), s.block_table(a).end());
  s.finish(a);
  EXPECT_EQ(s.pool().cached_blocks(), 3) << "a's three full blocks: 14 tokens computed";
  // b starts with a's three full blocks: only its own two tokens are computed.
  const auto [b, b_first] = run(b_prompt);
  EXPECT_EQ(b_first.start, 12);
  EXPECT_EQ(b_first.count, 2);
  EXPECT_EQ(s.prefix_hit_tokens(), 12);
  EXPECT_EQ(std::vector<BlockId>(s.block_table(b).begin(), s.block_table(b).begin() + 3),
            std::vector<BlockId>(a_blocks.begin(), a_blocks.begin() + 3));
  EXPECT_EQ(std::vector<std::int32_t>(s.tokens(b).begin() + 14, s.tokens(b).end()),
            alone(b_prompt, 2));
  // A prompt that is exactly the cached blocks computes its last block again, to sample.
  const auto [c, c_first] = run(shared);
  EXPECT_EQ(c_first.start, 8);
  EXPECT_EQ(c_first.count, 4);
  EXPECT_EQ(s.prefix_hit_tokens(), 12 + 8);
  EXPECT_EQ(s.pool().ref_count(a_blocks[0]), 2) << "b and c hold it";
  s.finish(b);
  s.finish(c);
  EXPECT_EQ(s.pool().free_blocks(), 15);
}

TEST(SchedulerTest, AdmissionReservesSoRunningSequencesNeverLackABlock) {
  // 6 usable blocks of 4 tokens; each request may take 3 blocks (8 + 4 - 1 positions).
  Scheduler s({.block_size = 4, .blocks = 7, .batch_tokens = 64, .max_running = 8});
  FakeModel model(7, 4);
  const SequenceId a = *s.add(std::vector<std::int32_t>(8, 1), 4);
  const SequenceId b = *s.add(std::vector<std::int32_t>(8, 2), 4);
  const SequenceId c = *s.add(std::vector<std::int32_t>(8, 3), 4);
  ScheduledStep step = s.schedule();
  EXPECT_EQ(step.chunks.size(), 2u) << "c waits: a and b may come to hold all 6 blocks";
  EXPECT_TRUE(s.running(a));
  EXPECT_TRUE(s.running(b));
  EXPECT_FALSE(s.running(c));
  s.complete(step, model.run(s, step));
  s.finish(a);
  step = s.schedule();
  EXPECT_TRUE(s.running(c)) << "a's blocks came back";
  s.complete(step, model.run(s, step));
}

TEST(SchedulerTest, BadCallsAreRefusedByNameAndChangeNothing) {
  EXPECT_THAT([] { Scheduler({.block_size = 0, .blocks = 8}); },
              ThrowsMessage<ValueError>("scheduler: block_size 0 must be positive"));
  EXPECT_THAT([] { Scheduler({.blocks = 1}); },
              ThrowsMessage<ValueError>(
                  "scheduler: 1 blocks; the pool needs its scratch block and at least one more"));
  EXPECT_THAT([] { Scheduler({.blocks = 8, .batch_tokens = 4, .max_running = 5}); },
              ThrowsMessage<ValueError>("scheduler: batch_tokens 4 must be at least max_running 5 "
                                        "(every running sequence decodes in every step)"));
  EXPECT_THAT([] { Scheduler({.blocks = 8, .max_waiting = 0}); },
              ThrowsMessage<ValueError>("scheduler: max_waiting 0 must be at least 1 (a request "
                                        "waits for its first step)"));
  Scheduler s({.block_size = 4, .blocks = 5, .max_waiting = 1, .max_context = 20});
  EXPECT_THAT([&] { (void)s.add({}, 1); }, ThrowsMessage<ShapeError>("add: the prompt is empty"));
  EXPECT_THAT([&] { (void)s.add({1}, 0); },
              ThrowsMessage<ValueError>("add: max_new_tokens 0 must be at least 1"));
  EXPECT_THAT(
      [&] {
        (void)s.add({1, 2}, 20);
      },
      ThrowsMessage<ValueError>("add: a prompt of 2 tokens and 20 new tokens take 21 "
                                "positions, past the 20 a sequence may take"));
  EXPECT_THAT(
      [&] {
        (void)s.add({1, 2}, 16);
      },
      ThrowsMessage<ValueError>("add: a prompt of 2 tokens and 16 new tokens need 5 "
                                "blocks of 4 tokens; the cache holds 4"));
  EXPECT_EQ(s.waiting(), 0) << "nothing refused was queued";
  const SequenceId a = *s.add({1, 2}, 2);
  EXPECT_FALSE(s.add({3}, 1).has_value()) << "max_waiting 1";
  EXPECT_THAT([&] { s.finish(a + 1); },
              ThrowsMessage<KeyError>("finish: no sequence 1 (never added, or finished)"));
  const ScheduledStep step = s.schedule();
  EXPECT_THAT([&] { s.complete(step, {}); },
              ThrowsMessage<ShapeError>("complete: 0 sampled tokens for a step of 1 sampling "
                                        "chunks"));
  EXPECT_EQ(s.computed(a), 0) << "a refused completion records nothing";
  const std::vector<std::int32_t> one{7};
  s.complete(step, one);
  EXPECT_THAT([&] { s.complete(step, one); },
              ThrowsMessage<ValueError>("complete: sequence 0 has 2 tokens computed, the chunk "
                                        "starts at 0: not the step schedule() gave last"));
  s.finish(a);
  EXPECT_THAT([&] { (void)s.tokens(a); },
              ThrowsMessage<KeyError>("tokens: no sequence 0 (never added, or finished)"));
  EXPECT_EQ(s.pool().free_blocks(), 4);
}

}  // namespace
}  // namespace numesh::models
