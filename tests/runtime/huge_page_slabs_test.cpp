#include "numesh/runtime/huge_page_slabs.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "numesh/runtime/huge_page_cost.hpp"
#include "thp_eligible.hpp"

namespace numesh::runtime {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kHuge = HugePageSlabs::kHugePage;

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The regions prepare() was given, in order; it accepts them while `accept` is true.
struct Regions {
  std::vector<std::pair<std::byte*, std::size_t>> seen;
  bool accept = true;
  HugePageSlabs::Prepare prepare() {
    return [this](std::byte* region, std::size_t bytes) {
      seen.emplace_back(region, bytes);
      return accept;
    };
  }
};

TEST(HugePageSlabsTest, SmallBlocksShareAnAlignedSlabAndAreReusedOnceReleased) {
  Regions regions;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 4 * kMiB);
  std::byte* a = slabs.allocate(100);
  std::byte* b = slabs.allocate(5000);
  std::byte* c = slabs.allocate(64);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(regions.seen.size(), 1u) << "one slab for all three";
  EXPECT_EQ(address(regions.seen[0].first) % kHuge, 0u) << "a slab starts on a huge page";
  EXPECT_EQ(regions.seen[0].second, 4 * kMiB);
  EXPECT_EQ(a, regions.seen[0].first) << "first fit";
  EXPECT_EQ(address(a) % 64, 0u);
  EXPECT_EQ(address(b) % 4096, 0u) << "a block of a page or more is page-aligned";
  EXPECT_EQ(address(c), address(a) + 128) << "100 bytes take two cache lines";
  // The blocks are memory of their own: writing one leaves the others as they were.
  std::memset(a, 1, 100);
  std::memset(b, 2, 5000);
  std::memset(c, 3, 64);
  EXPECT_EQ(a[99], std::byte{1});
  EXPECT_EQ(b[0], std::byte{2});
  EXPECT_EQ(b[4999], std::byte{2});
  EXPECT_EQ(c[0], std::byte{3});
  slabs.release(b, 5000);
  std::byte* d = slabs.allocate(4096);
  EXPECT_EQ(d, b) << "the released block's memory serves the next one that fits";
  EXPECT_EQ(slabs.mapped_bytes(), 4 * kMiB);
  slabs.release(a, 100);
  slabs.release(c, 64);
  slabs.release(d, 4096);
  EXPECT_EQ(slabs.slab_count(), 1u) << "the only empty slab stays for the next blocks";
}

// A model lays out its norms between its matrices: were they carved from one slab, each norm
// would sit on a huge page of its own and its first touch would zero 2 MiB.
TEST(HugePageSlabsTest, BlocksUnder64KiBShareSlabsOfTheirOwnBetweenLargerBlocks) {
  Regions regions;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 8 * kMiB);
  constexpr std::size_t kSmall = HugePageSlabs::kSmallBlockBytes;
  std::vector<std::byte*> norms, matrices;
  for (int i = 0; i < 4; ++i) {
    matrices.push_back(slabs.allocate(kMiB));
    norms.push_back(slabs.allocate(3072));
  }
  std::byte* last_small = slabs.allocate(kSmall - 1);
  std::byte* first_medium = slabs.allocate(kSmall);
  ASSERT_EQ(regions.seen.size(), 2u) << "one slab for the matrices, one for the norms";
  EXPECT_EQ(slabs.slab_count(), 2u);
  std::byte* const matrix_slab = regions.seen[0].first;
  std::byte* const norm_slab = regions.seen[1].first;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(matrices[static_cast<std::size_t>(i)], matrix_slab + i * kMiB) << i;
    // 3072 bytes are whole cache lines: the norms lie back to back.
    EXPECT_EQ(norms[static_cast<std::size_t>(i)], norm_slab + i * 3072) << i;
  }
  // The norms end at 12288, a page boundary: the next block, page-aligned, starts there.
  EXPECT_EQ(last_small, norm_slab + 3 * 4096) << "page-aligned from 4096 bytes up, still small";
  EXPECT_EQ(first_medium, matrix_slab + 4 * kMiB) << "64 KiB is no longer small";
  // Released, each class keeps one empty slab of its own for its next blocks.
  for (std::byte* p : matrices) slabs.release(p, kMiB);
  for (std::byte* p : norms) slabs.release(p, 3072);
  slabs.release(last_small, kSmall - 1);
  slabs.release(first_medium, kSmall);
  EXPECT_EQ(slabs.slab_count(), 2u);
  EXPECT_EQ(slabs.allocate(100), norm_slab);
  EXPECT_EQ(slabs.allocate(kMiB), matrix_slab);
  EXPECT_EQ(regions.seen.size(), 2u) << "no slab mapped anew";
}

TEST(HugePageSlabsTest, LargeBlocksGetAlignedMappingsOfWholeHugePages) {
  Regions regions;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 4 * kMiB);
  const std::size_t bytes = 3 * kMiB + 5;  // from half a slab up: a mapping of its own
  std::byte* big = slabs.allocate(bytes);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(address(big) % kHuge, 0u);
  ASSERT_EQ(regions.seen.size(), 1u);
  EXPECT_EQ(regions.seen[0].second, 4 * kMiB) << "rounded up to whole huge pages";
  EXPECT_EQ(slabs.slab_count(), 0u);
  EXPECT_EQ(slabs.mapped_bytes(), 4 * kMiB);
  std::memset(big, 7, bytes);
  EXPECT_EQ(big[bytes - 1], std::byte{7});
  slabs.release(big, bytes);
  EXPECT_EQ(slabs.mapped_bytes(), 0u) << "a large block's mapping goes with it";
}

TEST(HugePageSlabsTest, NewSlabsWhenTheFirstIsFullAndOneEmptySlabKept) {
  Regions regions;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/false, 4 * kMiB);
  std::vector<std::byte*> blocks;
  for (int i = 0; i < 12; ++i) {  // 1.5 MiB each: two a slab
    std::byte* block = slabs.allocate(3 * kMiB / 2);
    ASSERT_NE(block, nullptr);
    blocks.push_back(block);
  }
  EXPECT_EQ(slabs.slab_count(), 6u);
  EXPECT_EQ(regions.seen.size(), 6u);
  for (std::byte* p : blocks) slabs.release(p, 3 * kMiB / 2);
  EXPECT_EQ(slabs.slab_count(), 1u) << "empty slabs are unmapped but one";
  EXPECT_EQ(slabs.mapped_bytes(), 4 * kMiB);
  EXPECT_EQ(slabs.allocate(0), nullptr);
  EXPECT_EQ(slabs.allocate(SIZE_MAX - 100), nullptr) << "too large to round up";
}

// A region that prepare() refuses (a bound device that cannot bind it) is unmapped, and
// allocate() says so with nullptr; pointers inside no slab are ignored by release().
TEST(HugePageSlabsTest, RefusedRegionsAreNotUsedAndForeignPointersAreIgnored) {
  Regions regions;
  regions.accept = false;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 4 * kMiB);
  EXPECT_EQ(slabs.allocate(1000), nullptr);
  EXPECT_EQ(slabs.allocate(3 * kMiB), nullptr);
  EXPECT_EQ(regions.seen.size(), 2u);
  EXPECT_EQ(slabs.mapped_bytes(), 0u);
  EXPECT_EQ(slabs.slab_count(), 0u);
  regions.accept = true;
  std::byte* block = slabs.allocate(1000);
  ASSERT_NE(block, nullptr);
  std::byte outside[64];
  slabs.release(outside, sizeof outside);      // below or above every slab
  slabs.release(block + 4 * kMiB + 4096, 64);  // past the slab's end
  EXPECT_EQ(slabs.allocate(1000), block + 1024) << "the slab's bookkeeping is untouched";
}

// Where new huge pages are dear (every fault counts as dear at a threshold of 0), the first
// region's first two pages are faulted in and timed (and stay zero), the rest of it is marked
// small, and no later region asks; where they are cheap (a threshold of an hour) or the cost is
// not adaptive (NUMESH_HUGE_PAGES=on), every region asks.
TEST(HugePageCostTest, SlabsStopAskingForHugePagesAfterTwoDearFaults) {
  if (testing::thp_setting() != "madvise")
    GTEST_SKIP() << "transparent huge pages are '" << testing::thp_setting()
                 << "' here: madvise changes nothing";
  static_assert(HugePageCost::kDearFaultsToGiveUp == 2);
  Regions regions;
  HugePageCost dear(/*adaptive=*/true, std::chrono::nanoseconds(0));
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 4 * kMiB, &dear);
  EXPECT_TRUE(dear.wanted());
  std::byte* first = slabs.allocate(6 * kMiB);  // three huge pages
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(dear.dear_faults(), 2) << "its first two pages timed, then given up";
  EXPECT_FALSE(dear.wanted());
  EXPECT_EQ(testing::thp_eligible(first), 1);
  EXPECT_EQ(testing::thp_eligible(first + 2 * kMiB), 1) << "the second dear fault";
  EXPECT_EQ(testing::thp_eligible(first + 4 * kMiB), 0) << "not touched when it gave up: small";
  std::byte* later = slabs.allocate(4 * kMiB);
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(testing::thp_eligible(later), 0) << "mapped after giving up";
  std::byte* small = slabs.allocate(1000);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(testing::thp_eligible(small), 0) << "a slab mapped after giving up";
  EXPECT_EQ(dear.dear_faults(), 2) << "nothing timed after giving up";
  for (std::size_t i = 0; i < 6 * kMiB; i += 4096) ASSERT_EQ(first[i], std::byte{0});
  for (const bool adaptive : {true, false}) {
    HugePageCost cheap(adaptive, adaptive ? std::chrono::nanoseconds(std::chrono::hours(1))
                                          : std::chrono::nanoseconds(0));
    HugePageSlabs asking(regions.prepare(), /*huge_pages=*/true, 4 * kMiB, &cheap);
    for (int i = 0; i < 3; ++i) {
      std::byte* p = asking.allocate(20 * kMiB);  // more than the pages probed
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(testing::thp_eligible(p + 18 * kMiB), 1) << (adaptive ? "cheap" : "on");
    }
    EXPECT_EQ(cheap.dear_faults(), 0) << "faults under the threshold, or not adaptive";
    EXPECT_TRUE(cheap.wanted());
  }
}

// Whether the 4 KiB page at `p` is resident (mincore), i.e. something touched it.
bool resident(const std::byte* p) {
  unsigned char in_core = 0;
  const auto page = reinterpret_cast<void*>(address(p) & ~std::uintptr_t{4095});
  EXPECT_EQ(mincore(page, 4096, &in_core), 0) << std::strerror(errno);
  return (in_core & 1) != 0;
}

// A new slab's probe faults in only the pages of its first block, not the slab's first eight
// (most of which a process's few small blocks never use), and a large block's pages up to the
// eight probed. At a dear threshold of 0 every fault timed counts, so dear_faults() is the
// number of pages probed until it gives up (after two), and then every slab's pages not yet
// touched are marked small; at an hour none counts, and residency shows what was faulted in.
TEST(HugePageCostTest, ANewSlabProbesOnlyItsFirstBlocksPages) {
  if (testing::thp_setting() != "madvise")
    GTEST_SKIP() << "transparent huge pages are '" << testing::thp_setting()
                 << "' here: madvise changes nothing";
  Regions regions;
  {
    HugePageCost cheap(/*adaptive=*/true, std::chrono::hours(1));
    HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 32 * kMiB, &cheap);
    std::byte* first = slabs.allocate(1000);
    ASSERT_NE(first, nullptr);
    EXPECT_TRUE(resident(first)) << "the first block's page, probed";
    for (std::size_t at = kHuge; at < 32 * kMiB; at += kHuge)
      EXPECT_FALSE(resident(first + at)) << "the slab's page at " << at / kMiB << " MiB";
    std::byte* block = slabs.allocate(3 * kMiB);  // blocks of 64 KiB and more: a new slab
    ASSERT_NE(block, nullptr);
    EXPECT_TRUE(resident(block));
    EXPECT_TRUE(resident(block + 2 * kMiB)) << "the first block's second page";
    EXPECT_FALSE(resident(block + 4 * kMiB)) << "past the first block";
    EXPECT_EQ(cheap.dear_faults(), 0);
  }
  HugePageCost counting(/*adaptive=*/true, std::chrono::nanoseconds(0));
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 32 * kMiB, &counting);
  std::byte* small = slabs.allocate(1000);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(counting.dear_faults(), 1) << "the page of the slab's first block only";
  ASSERT_NE(slabs.allocate(1000), nullptr);
  EXPECT_EQ(counting.dear_faults(), 1) << "a later block of the slab";
  EXPECT_TRUE(counting.wanted()) << "one fault does not decide";
  EXPECT_EQ(testing::thp_eligible(small + 2 * kMiB), 1);
  // A block of 3 MiB: a new slab, whose first page is the second dear fault; its second page,
  // not touched when the probe gave up, stays small, and so do the first slab's other pages.
  std::byte* block = slabs.allocate(3 * kMiB);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(counting.dear_faults(), 2);
  EXPECT_FALSE(counting.wanted());
  EXPECT_EQ(testing::thp_eligible(block + 2 * kMiB), 0) << "marked small on giving up";
  EXPECT_EQ(testing::thp_eligible(small + 2 * kMiB), 0) << "the first slab, marked small too";
  for (std::size_t i = 0; i < 3 * kMiB; i += 4096) ASSERT_EQ(block[i], std::byte{0});
}

}  // namespace
}  // namespace numesh::runtime
