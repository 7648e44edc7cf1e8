#include "numesh/ops/kernels/attention_core.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <optional>
#include <string>
#include <vector>

#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "numesh/runtime/tensor.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

struct CoreCase {
  std::int64_t batch, q_len, kv_len, heads, kv_heads, head_dim, q_offset;
  bool causal;
  bool bhtd;  // keys and values laid out [B, kv_heads, S, D] instead of [B, S, kv_heads, D]
};

std::string label(const CoreCase& c) {
  return "B" + std::to_string(c.batch) + " T" + std::to_string(c.q_len) + " S" +
         std::to_string(c.kv_len) + " heads " + std::to_string(c.heads) + "/" +
         std::to_string(c.kv_heads) + " d" + std::to_string(c.head_dim) + " at " +
         std::to_string(c.q_offset) + (c.causal ? " causal" : " full") +
         (c.bhtd ? " bhtd" : " bthd");
}

// attention_core in an arena of `threads` threads; keys and values given bthd and, for a bhtd
// case, transposed into that layout first.
runtime::HostTensor run_core(const CoreCase& c, const runtime::HostTensor& q,
                             const runtime::HostTensor& k, const runtime::HostTensor& v,
                             int threads, DType kv_dtype = DType::kF32) {
  const std::int64_t d = c.head_dim;
  std::vector<float> kl = k.data, vl = v.data;
  KvView kv{
      .batch_stride = c.kv_len * c.kv_heads * d, .pos_stride = c.kv_heads * d, .head_stride = d};
  if (c.bhtd) {
    for (std::int64_t b = 0; b < c.batch; ++b) {
      for (std::int64_t s = 0; s < c.kv_len; ++s) {
        for (std::int64_t h = 0; h < c.kv_heads; ++h) {
          for (std::int64_t i = 0; i < d; ++i) {
            const auto from =
                static_cast<std::size_t>(((b * c.kv_len + s) * c.kv_heads + h) * d + i);
            const auto to = static_cast<std::size_t>(((b * c.kv_heads + h) * c.kv_len + s) * d + i);
            kl[to] = k.data[from];
            vl[to] = v.data[from];
          }
        }
      }
    }
    kv.pos_stride = d;
    kv.head_stride = c.kv_len * d;
  }
  kv.k = kl.data();
  kv.v = vl.data();
  // A 16-bit cache: the same layout, each value rounded to bf16 or f16 bits.
  std::vector<std::uint16_t> k16(kl.size()), v16(vl.size());
  if (kv_dtype != DType::kF32) {
    const auto narrow = [&](float x) {
      return kv_dtype == DType::kBF16 ? bf16_from_f32(x) : f16_from_f32(x);
    };
    for (std::size_t i = 0; i < kl.size(); ++i) {
      k16[i] = narrow(kl[i]);
      v16[i] = narrow(vl[i]);
    }
    kv.k = k16.data();
    kv.v = v16.data();
    kv.dtype = kv_dtype;
  }
  const AttentionSlice slice{.batch = c.batch,
                             .q_len = c.q_len,
                             .kv_len = c.kv_len,
                             .q_heads = c.heads,
                             .kv_heads = c.kv_heads,
                             .group = c.heads / c.kv_heads};
  runtime::HostTensor out = runtime::HostTensor::zeros({c.batch, c.q_len, c.heads, d});
  std::vector<float> scratch(
      static_cast<std::size_t>(attention_scratch_floats(slice, d, threads, kv_dtype)));
  oneapi::tbb::task_arena arena(threads);
  arena.execute([&] {
    attention_core(q.data.data(), kv, out.data.data(), slice, d, c.q_offset, c.causal, scratch);
  });
  return out;
}

// The prefill path (whole and partial 64-query blocks) and the decode path (one or several
// queries, one or several 256-key blocks, some hidden by the mask, merged on the calling thread or
// in tasks) in arenas of 1, 2, 3, 4 and
// 7 threads: bitwise the same, and equal to the float64 reference.
TEST(AttentionCoreTest, EqualsTheReferenceBitwiseTheSameForAnyThreadCount) {
  // Enough workers that an arena of 7 really runs 7 threads at once (on 2 cores too): the
  // per-thread scratch and the tiles are then used concurrently, not one after another.
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  for (const CoreCase& c : {CoreCase{2, 150, 150, 4, 2, 16, 0, true, false},
                            CoreCase{1, 70, 100, 2, 1, 32, 30, true, true},
                            CoreCase{2, 20, 33, 3, 3, 8, 0, false, false},
                            CoreCase{2, 1, 700, 4, 2, 16, 699, true, false},
                            CoreCase{1, 3, 600, 4, 4, 8, 597, true, true},
                            CoreCase{1, 5, 300, 2, 1, 16, 100, true, false},
                            CoreCase{3, 1, 9, 2, 2, 8, 8, false, false},
                            // Groups past four query heads a kv head: runs of 4 + 2 and 4 + 4.
                            CoreCase{1, 3, 600, 12, 2, 16, 597, true, false},
                            CoreCase{2, 1, 300, 8, 1, 16, 299, true, true},
                            // Enough partials (4 x 16 heads x 9 key blocks) that the blocks
                            // merge in tasks; the cases above merge on the calling thread.
                            CoreCase{4, 1, 2100, 16, 4, 64, 2099, true, false}}) {
    const runtime::HostTensor q =
        testing::random_host({c.batch, c.q_len, c.heads, c.head_dim}, 3, 1.0f);
    const runtime::HostTensor k =
        testing::random_host({c.batch, c.kv_len, c.kv_heads, c.head_dim}, 4, 1.0f);
    const runtime::HostTensor v =
        testing::random_host({c.batch, c.kv_len, c.kv_heads, c.head_dim}, 5, 1.0f);
    AttentionConfig config{.num_heads = c.heads,
                           .num_kv_heads = c.kv_heads,
                           .head_dim = c.head_dim,
                           .causal = c.causal,
                           .q_offset = c.q_offset,
                           .rope_theta = 0.0f};
    const runtime::HostTensor want = attention_reference(q, k, v, config);
    std::optional<runtime::HostTensor> first;
    for (int threads : {1, 2, 3, 4, 7}) {
      const runtime::HostTensor got = run_core(c, q, k, v, threads);
      if (!first) {
        EXPECT_TRUE(testing::matches_reference(got, want, 2e-6)) << label(c);
        first = got;
      } else {
        EXPECT_TRUE(got == *first) << label(c) << ": " << threads << " threads differ from 1";
      }
    }
  }
}

// A bf16 or f16 cache, prefill (blocked) and decode paths, both layouts: bitwise the fp32 path's
// over the cache's values widened, for any thread count.
TEST(AttentionCoreTest, SixteenBitCachesGiveTheBitsOfTheirWidenedValues) {
  const oneapi::tbb::global_control workers(oneapi::tbb::global_control::max_allowed_parallelism,
                                            8);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const CoreCase& c : {CoreCase{2, 150, 150, 4, 2, 16, 0, true, false},
                              CoreCase{1, 70, 100, 2, 1, 32, 30, true, true},
                              CoreCase{2, 20, 33, 3, 3, 16, 0, false, false},
                              CoreCase{2, 1, 700, 4, 2, 16, 699, true, false},
                              CoreCase{1, 3, 600, 4, 4, 64, 597, true, true},
                              CoreCase{1, 3, 600, 12, 2, 16, 597, true, false}}) {
      const runtime::HostTensor q =
          testing::random_host({c.batch, c.q_len, c.heads, c.head_dim}, 3, 1.0f);
      const runtime::HostTensor k = rounded_to(
          testing::random_host({c.batch, c.kv_len, c.kv_heads, c.head_dim}, 4, 1.0f), dtype);
      const runtime::HostTensor v = rounded_to(
          testing::random_host({c.batch, c.kv_len, c.kv_heads, c.head_dim}, 5, 1.0f), dtype);
      const runtime::HostTensor want = run_core(c, q, k, v, 1);
      for (int threads : {1, 2, 3}) {
        EXPECT_TRUE(run_core(c, q, k, v, threads, dtype) == want)
            << to_string(dtype) << " " << label(c) << ", " << threads << " threads";
      }
    }
  }
}

TEST(AttentionCoreTest, SixteenBitCachesRefuseHeadSizesOutsideWholeChunksAndOtherDtypes) {
  const AttentionSlice slice{.batch = 1, .q_len = 1, .kv_len = 8, .q_heads = 1, .kv_heads = 1};
  std::vector<float> q(8), out(8), scratch(4096);
  std::vector<std::uint16_t> k(64), v(64);
  KvView kv{.k = k.data(),
            .v = v.data(),
            .batch_stride = 64,
            .pos_stride = 8,
            .head_stride = 8,
            .dtype = DType::kBF16};
  oneapi::tbb::task_arena arena(1);
  EXPECT_THAT(
      [&] {
        arena.execute(
            [&] { attention_core(q.data(), kv, out.data(), slice, 8, 7, true, scratch); });
      },
      ThrowsMessage<ShapeError>(HasSubstr(
          "attention: a bf16 KV cache needs a head size that is a multiple of 16, not 8")));
  kv.dtype = DType::kQ8_0;
  EXPECT_THAT(
      [&] {
        arena.execute(
            [&] { attention_core(q.data(), kv, out.data(), slice, 8, 7, true, scratch); });
      },
      ThrowsMessage<TypeError>(
          HasSubstr("keys and values stored as q8_0: expected f32, bf16 or f16")));
}

TEST(AttentionCoreTest, ShortScratchIsRefusedNamingTheSizes) {
  const AttentionSlice slice{.batch = 1, .q_len = 1, .kv_len = 8, .q_heads = 1, .kv_heads = 1};
  std::vector<float> q(8), k(64), v(64), out(8), scratch(4);
  const KvView kv{
      .k = k.data(), .v = v.data(), .batch_stride = 64, .pos_stride = 8, .head_stride = 8};
  oneapi::tbb::task_arena arena(1);
  EXPECT_THAT(
      [&] {
        arena.execute(
            [&] { attention_core(q.data(), kv, out.data(), slice, 8, 7, true, scratch); });
      },
      ThrowsMessage<ShapeError>(
          HasSubstr("attention: scratch of 4 floats; 8 keys, 1 queries and 1 threads need")));
}

}  // namespace
}  // namespace numesh::ops
