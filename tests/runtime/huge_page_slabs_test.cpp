#include "numesh/runtime/huge_page_slabs.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace numesh::runtime {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kHuge = HugePageSlabs::kHugePage;

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The regions prepare() was given, in order.
struct Regions {
  std::vector<std::pair<std::byte*, std::size_t>> seen;
  bool bind = false;
  HugePageSlabs::Prepare prepare() {
    return [this](std::byte* region, std::size_t bytes) {
      seen.emplace_back(region, bytes);
      return bind;
    };
  }
};

TEST(HugePageSlabsTest, SmallBlocksShareAnAlignedSlabAndAreReusedOnceReleased) {
  Regions regions;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 4 * kMiB);
  const HugePageSlabs::Block a = slabs.allocate(100);
  const HugePageSlabs::Block b = slabs.allocate(5000);
  const HugePageSlabs::Block c = slabs.allocate(64);
  ASSERT_NE(a.data, nullptr);
  ASSERT_NE(b.data, nullptr);
  ASSERT_NE(c.data, nullptr);
  ASSERT_EQ(regions.seen.size(), 1u) << "one slab for all three";
  EXPECT_EQ(address(regions.seen[0].first) % kHuge, 0u) << "a slab starts on a huge page";
  EXPECT_EQ(regions.seen[0].second, 4 * kMiB);
  EXPECT_EQ(a.data, regions.seen[0].first) << "first fit";
  EXPECT_EQ(address(a.data) % 64, 0u);
  EXPECT_EQ(address(b.data) % 4096, 0u) << "a block of a page or more is page-aligned";
  EXPECT_EQ(address(c.data), address(a.data) + 128) << "100 bytes take two cache lines";
  EXPECT_FALSE(a.bound) << "prepare() said it could not bind";
  // The blocks are memory of their own: writing one leaves the others as they were.
  std::memset(a.data, 1, 100);
  std::memset(b.data, 2, 5000);
  std::memset(c.data, 3, 64);
  EXPECT_EQ(a.data[99], std::byte{1});
  EXPECT_EQ(b.data[0], std::byte{2});
  EXPECT_EQ(b.data[4999], std::byte{2});
  EXPECT_EQ(c.data[0], std::byte{3});
  slabs.release(b.data, 5000);
  const HugePageSlabs::Block d = slabs.allocate(4096);
  EXPECT_EQ(d.data, b.data) << "the released block's memory serves the next one that fits";
  EXPECT_EQ(slabs.mapped_bytes(), 4 * kMiB);
  slabs.release(a.data, 100);
  slabs.release(c.data, 64);
  slabs.release(d.data, 4096);
  EXPECT_EQ(slabs.slab_count(), 1u) << "the only empty slab stays for the next blocks";
}

TEST(HugePageSlabsTest, LargeBlocksGetAlignedMappingsOfWholeHugePages) {
  Regions regions;
  regions.bind = true;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/true, 4 * kMiB);
  const std::size_t bytes = 3 * kMiB + 5;  // from half a slab up: a mapping of its own
  const HugePageSlabs::Block big = slabs.allocate(bytes);
  ASSERT_NE(big.data, nullptr);
  EXPECT_TRUE(big.bound);
  EXPECT_EQ(address(big.data) % kHuge, 0u);
  ASSERT_EQ(regions.seen.size(), 1u);
  EXPECT_EQ(regions.seen[0].second, 4 * kMiB) << "rounded up to whole huge pages";
  EXPECT_EQ(slabs.slab_count(), 0u);
  EXPECT_EQ(slabs.mapped_bytes(), 4 * kMiB);
  std::memset(big.data, 7, bytes);
  EXPECT_EQ(big.data[bytes - 1], std::byte{7});
  slabs.release(big.data, bytes);
  EXPECT_EQ(slabs.mapped_bytes(), 0u) << "a large block's mapping goes with it";
}

TEST(HugePageSlabsTest, NewSlabsWhenTheFirstIsFullAndOneEmptySlabKept) {
  Regions regions;
  HugePageSlabs slabs(regions.prepare(), /*huge_pages=*/false, 4 * kMiB);
  std::vector<std::byte*> blocks;
  for (int i = 0; i < 12; ++i) {  // 1.5 MiB each: two a slab
    const HugePageSlabs::Block block = slabs.allocate(3 * kMiB / 2);
    ASSERT_NE(block.data, nullptr);
    blocks.push_back(block.data);
  }
  EXPECT_EQ(slabs.slab_count(), 6u);
  EXPECT_EQ(regions.seen.size(), 6u);
  for (std::byte* p : blocks) slabs.release(p, 3 * kMiB / 2);
  EXPECT_EQ(slabs.slab_count(), 1u) << "empty slabs are unmapped but one";
  EXPECT_EQ(slabs.mapped_bytes(), 4 * kMiB);
  EXPECT_EQ(slabs.allocate(0).data, nullptr);
}

}  // namespace
}  // namespace numesh::runtime
