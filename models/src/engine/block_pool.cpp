#include "numesh/models/engine/block_pool.hpp"

#include <fmt/format.h>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::models {

BlockHash block_hash(BlockHash parent, std::span<const std::int32_t> tokens) noexcept {
  constexpr std::uint64_t kPrime = 0x100000001b3ULL;
  std::uint64_t h = 0xcbf29ce484222325ULL;
  const auto mix = [&](std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      h ^= (value >> (8 * i)) & 0xffU;
      h *= kPrime;
    }
  };
  mix(parent, 8);
  for (const std::int32_t t : tokens) mix(static_cast<std::uint32_t>(t), 4);
  return h;
}

BlockPool::BlockPool(std::int64_t blocks) {
  NUMESH_CHECK(blocks >= 2, ValueError,
               "block pool: {} blocks; it needs the scratch block and at least one more", blocks);
  const auto n = static_cast<std::size_t>(blocks);
  refs_.assign(n, 0);
  where_.resize(n);
  hash_of_.resize(n);
  for (BlockId b = 1; b < static_cast<BlockId>(blocks); ++b) {
    where_[static_cast<std::size_t>(b)] = free_.insert(free_.end(), b);
  }
}

void BlockPool::check_held(BlockId block, const char* call) const {
  const bool inside = block >= 1 && block < static_cast<BlockId>(refs_.size());
  NUMESH_CHECK(inside, IndexError, "{}: block {} is outside [1, {})", call, block, refs_.size());
  NUMESH_CHECK(refs_[static_cast<std::size_t>(block)] > 0, IndexError, "{}: block {} is not held",
               call, block);
}

std::int32_t BlockPool::ref_count(BlockId block) const {
  const bool inside = block >= 1 && block < static_cast<BlockId>(refs_.size());
  NUMESH_CHECK(inside, IndexError, "ref_count: block {} is outside [1, {})", block, refs_.size());
  return refs_[static_cast<std::size_t>(block)];
}

std::optional<std::vector<BlockId>> BlockPool::allocate(std::int64_t n) {
  NUMESH_CHECK(n >= 0, ValueError, "allocate: {} blocks", n);
  if (n > free_blocks()) return std::nullopt;
  std::vector<BlockId> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const BlockId b = free_.front();
    free_.pop_front();
    const auto ub = static_cast<std::size_t>(b);
    if (hash_of_[ub]) {  // evicted: its prefix is forgotten
      by_hash_.erase(*hash_of_[ub]);
      hash_of_[ub].reset();
    }
    refs_[ub] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::release(std::span<const BlockId> blocks) {
  // Checked whole first, counting a block listed twice, so that a bad call releases nothing.
  std::unordered_map<BlockId, std::int32_t> drops;
  for (const BlockId b : blocks) {
    check_held(b, "release");
    const std::int32_t dropped = ++drops[b];
    NUMESH_CHECK(dropped <= refs_[static_cast<std::size_t>(b)], IndexError,
                 "release: block {} is held {} times, released {}", b,
                 refs_[static_cast<std::size_t>(b)], dropped);
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const auto ub = static_cast<std::size_t>(*it);
    if (--refs_[ub] == 0) where_[ub] = free_.insert(free_.end(), *it);
  }
}

std::optional<BlockId> BlockPool::hit(BlockHash hash) {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const BlockId b = it->second;
  const auto ub = static_cast<std::size_t>(b);
  if (refs_[ub] == 0) free_.erase(where_[ub]);
  ++refs_[ub];
  return b;
}

void BlockPool::publish(BlockId block, BlockHash hash) {
  check_held(block, "publish");
  const auto ub = static_cast<std::size_t>(block);
  if (hash_of_[ub] || by_hash_.contains(hash)) return;
  by_hash_.emplace(hash, block);
  hash_of_[ub] = hash;
}

}  // namespace numesh::models
