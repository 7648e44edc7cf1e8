// paged_attention: a ragged batch of tokens from several sequences, each reading its own keys
// and values through its block table in a shuffled pool of blocks, gives bit for bit what
// attention_core's decode path gives each token alone on its sequence's keys laid out
// densely, in arenas of 1 and 3 threads; the spans and the scratch are checked.

#include "numesh/ops/kernels/paged_attention.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {
namespace {

using ::testing::ThrowsMessage;

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

struct Sequence {
  std::int64_t length;              // keys in the cache
  std::vector<float> k, v;          // dense [length, kv_heads, d]
  std::vector<std::int32_t> table;  // its blocks
};

// Slices of query heads over kv heads, as tp cuts them: groups of 2 with a cut one (q heads
// 1..3 of 4), groups of 6 (each kv head's queries in two runs, of 4 and 2), groups of 5 cut at
// both ends (q heads 3..7: two of kv head 0, three of kv head 1), and the second kv head's
// group of 4 alone (a kv head offset).
const AttentionSlice kSlices[] = {
    {.q_heads = 3, .kv_heads = 2, .group = 2, .q_head_offset = 1, .kv_head_offset = 0},
    {.q_heads = 12, .kv_heads = 2, .group = 6, .q_head_offset = 0, .kv_head_offset = 0},
    {.q_heads = 5, .kv_heads = 2, .group = 5, .q_head_offset = 3, .kv_head_offset = 0},
    {.q_heads = 4, .kv_heads = 1, .group = 4, .q_head_offset = 4, .kv_head_offset = 1},
};

class PagedAttentionSliceTest : public ::testing::TestWithParam<AttentionSlice> {};

TEST_P(PagedAttentionSliceTest, EachTokenGetsWhatItGetsAloneOnDenseKeys) {
  constexpr std::int64_t kBlock = 16, kBlocks = 80, d = 32;
  const AttentionSlice slice = GetParam();
  const std::int64_t kv_heads = slice.kv_heads, qh = slice.q_heads;
  std::mt19937 rng(5);
  // Three sequences: one past a 256-key block, one of a block and a bit, one of one key.
  std::vector<Sequence> seqs{{300, {}, {}, {}}, {17, {}, {}, {}}, {1, {}, {}, {}}};
  std::vector<std::int32_t> free(kBlocks - 1);
  std::iota(free.begin(), free.end(), 1);
  std::shuffle(free.begin(), free.end(), rng);
  // The pool: [blocks, kv_heads, block_size, d] (bhtd pages), filled through the tables.
  std::vector<float> k_pool(kBlocks * kv_heads * kBlock * d, 0.0f), v_pool(k_pool.size(), 0.0f);
  const PagedKvView kv{.k = k_pool.data(),
                       .v = v_pool.data(),
                       .block_size = kBlock,
                       .block_stride = kv_heads * kBlock * d,
                       .head_stride = kBlock * d,
                       .pos_stride = d};
  for (Sequence& s : seqs) {
    s.k = random_floats(static_cast<std::size_t>(s.length * kv_heads * d), rng);
    s.v = random_floats(s.k.size(), rng);
    for (std::int64_t b = 0; b < (s.length + kBlock - 1) / kBlock; ++b) {
      s.table.push_back(free.back());
      free.pop_back();
    }
    for (std::int64_t p = 0; p < s.length; ++p) {
      for (std::int64_t h = 0; h < kv_heads; ++h) {
        const std::int64_t at = s.table[static_cast<std::size_t>(p / kBlock)] * kv.block_stride +
                                h * kv.head_stride + (p % kBlock) * kv.pos_stride;
        std::copy_n(s.k.begin() + (p * kv_heads + h) * d, d, k_pool.begin() + at);
        std::copy_n(s.v.begin() + (p * kv_heads + h) * d, d, v_pool.begin() + at);
      }
    }
  }
  // The ragged batch: sequence 0's last three tokens (a prefill chunk), then one decode token
  // of each of the others.
  std::vector<std::int64_t> context{298, 299, 300, 17, 1}, which{0, 0, 0, 1, 2};
  std::vector<std::int32_t> tables;
  std::vector<std::int64_t> starts;
  for (const Sequence& s : seqs) {
    starts.push_back(static_cast<std::int64_t>(tables.size()));
    tables.insert(tables.end(), s.table.begin(), s.table.end());
  }
  std::vector<std::int64_t> table_of;
  for (const std::int64_t w : which) table_of.push_back(starts[static_cast<std::size_t>(w)]);
  const auto tokens = static_cast<std::int64_t>(context.size());
  const std::vector<float> q = random_floats(static_cast<std::size_t>(tokens * qh * d), rng);
  const RaggedKeys keys{.context = context, .table_of = table_of, .tables = tables};
  for (const int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    oneapi::tbb::task_arena arena(threads);
    std::vector<float> out(q.size(), -1.0f);
    std::vector<float> scratch(
        static_cast<std::size_t>(paged_attention_scratch_floats(tokens, qh, d, 300, threads)));
    arena.execute(
        [&] { paged_attention(q.data(), kv, keys, out.data(), tokens, slice, d, 300, scratch); });
    for (std::int64_t t = 0; t < tokens; ++t) {
      const Sequence& s = seqs[static_cast<std::size_t>(which[static_cast<std::size_t>(t)])];
      const std::int64_t ctx = context[static_cast<std::size_t>(t)];
      AttentionSlice alone = slice;
      alone.batch = 1;
      alone.q_len = 1;
      alone.kv_len = s.length;
      const KvView dense{.k = s.k.data(),
                         .v = s.v.data(),
                         .batch_stride = s.length * kv_heads * d,
                         .pos_stride = kv_heads * d,
                         .head_stride = d};
      std::vector<float> expected(static_cast<std::size_t>(qh * d));
      std::vector<float> core_scratch(
          static_cast<std::size_t>(attention_scratch_floats(alone, d, threads)));
      arena.execute([&] {
        attention_core(q.data() + t * qh * d, dense, expected.data(), alone, d, ctx - 1,
                       /*causal=*/true, core_scratch);
      });
      EXPECT_EQ(std::vector<float>(out.begin() + t * qh * d, out.begin() + (t + 1) * qh * d),
                expected)
          << "token " << t;
    }
  }
  // The same pool stored as bf16 or f16 bits gives the bits of the pool widened.
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(to_string(dtype));
    std::vector<std::uint16_t> k16(k_pool.size()), v16(v_pool.size());
    std::vector<float> kw(k_pool.size()), vw(v_pool.size());
    for (std::size_t i = 0; i < k_pool.size(); ++i) {
      k16[i] = dtype == DType::kBF16 ? bf16_from_f32(k_pool[i]) : f16_from_f32(k_pool[i]);
      v16[i] = dtype == DType::kBF16 ? bf16_from_f32(v_pool[i]) : f16_from_f32(v_pool[i]);
      kw[i] = dtype == DType::kBF16 ? f32_from_bf16(k16[i]) : f32_from_f16(k16[i]);
      vw[i] = dtype == DType::kBF16 ? f32_from_bf16(v16[i]) : f32_from_f16(v16[i]);
    }
    PagedKvView kv16 = kv, kv_widened = kv;
    kv16.k = k16.data();
    kv16.v = v16.data();
    kv16.dtype = dtype;
    kv_widened.k = kw.data();
    kv_widened.v = vw.data();
    oneapi::tbb::task_arena arena(2);
    std::vector<float> out16(q.size(), -1.0f), out_widened(q.size(), -2.0f);
    std::vector<float> scratch(
        static_cast<std::size_t>(paged_attention_scratch_floats(tokens, qh, d, 300, 2)));
    arena.execute([&] {
      paged_attention(q.data(), kv16, keys, out16.data(), tokens, slice, d, 300, scratch);
      paged_attention(q.data(), kv_widened, keys, out_widened.data(), tokens, slice, d, 300,
                      scratch);
    });
    EXPECT_EQ(out16, out_widened);
  }
}

INSTANTIATE_TEST_SUITE_P(Slices, PagedAttentionSliceTest, ::testing::ValuesIn(kSlices),
                         [](const ::testing::TestParamInfo<AttentionSlice>& param_info) {
                           const AttentionSlice& s = param_info.param;
                           return "q" + std::to_string(s.q_heads) + "_group" +
                                  std::to_string(s.group) + "_from" +
                                  std::to_string(s.q_head_offset);
                         });

TEST(PagedAttentionTest, SpansAndScratchAreChecked) {
  const AttentionSlice slice{.q_heads = 1, .kv_heads = 1};
  std::vector<float> pool(2 * 16 * 8, 1.0f), q(2 * 8, 1.0f), out(q.size());
  const PagedKvView kv{.k = pool.data(),
                       .v = pool.data(),
                       .block_size = 16,
                       .block_stride = 16 * 8,
                       .head_stride = 16 * 8,
                       .pos_stride = 8};
  const std::vector<std::int64_t> context{1, 2}, table_of{0};
  const std::vector<std::int32_t> tables{1};
  std::vector<float> scratch(1000);
  EXPECT_THAT(
      [&] {
        paged_attention(q.data(), kv, {.context = context, .table_of = table_of, .tables = tables},
                        out.data(), 2, slice, 8, 16, scratch);
      },
      ThrowsMessage<ShapeError>(
          "paged attention: 2 tokens, 2 context lengths and 1 table offsets"));
  const std::vector<std::int64_t> both{0, 0};
  std::vector<float> small(10);
  EXPECT_THAT(
      [&] {
        paged_attention(q.data(), kv, {.context = context, .table_of = both, .tables = tables},
                        out.data(), 2, slice, 8, 16, small);
      },
      ThrowsMessage<ShapeError>(::testing::StartsWith("paged attention: scratch of 10 floats")));
}

}  // namespace
}  // namespace numesh::ops
