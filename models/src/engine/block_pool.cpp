#include "numesh/models/engine/block_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

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
  next_.assign(n, kNone);
  prev_.assign(n, kNone);
  hash_of_.resize(n);
  dropping_.assign(n, 0);
  slots_.resize(std::bit_ceil(2 * n));
  spare_.resize(slots_.size());
  for (BlockId b = 1; b < static_cast<BlockId>(blocks); ++b) push_free(b);
}

void BlockPool::push_free(BlockId block) noexcept {
  const auto ub = static_cast<std::size_t>(block);
  prev_[ub] = tail_;
  next_[ub] = kNone;
  (tail_ == kNone ? head_ : next_[static_cast<std::size_t>(tail_)]) = block;
  tail_ = block;
  ++free_count_;
}

void BlockPool::unlink_free(BlockId block) noexcept {
  const auto ub = static_cast<std::size_t>(block);
  (prev_[ub] == kNone ? head_ : next_[static_cast<std::size_t>(prev_[ub])]) = next_[ub];
  (next_[ub] == kNone ? tail_ : prev_[static_cast<std::size_t>(next_[ub])]) = prev_[ub];
  prev_[ub] = next_[ub] = kNone;
  --free_count_;
}

std::size_t BlockPool::home(BlockHash hash) const noexcept {
  // splitmix64's finaliser: every bit of the hash reaches the low ones the mask keeps.
  hash = (hash ^ (hash >> 30)) * 0xbf58476d1ce4e5b9ULL;
  hash = (hash ^ (hash >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<std::size_t>(hash ^ (hash >> 31)) & (slots_.size() - 1);
}

std::size_t BlockPool::find_slot(BlockHash hash) const noexcept {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(hash);; i = (i + 1) & mask) {
    if (slots_[i].block == kNone) return kNoSlot;
    if (slots_[i].block != kGone && slots_[i].hash == hash) return i;
  }
}

void BlockPool::index_insert(BlockHash hash, BlockId block) noexcept {
  // Live entries are at most the blocks, half the table; with the erased ones past three
  // quarters, a rebuild keeps the probes short and an empty slot always there.
  if (static_cast<std::size_t>(cached_ + gone_ + 1) * 4 > slots_.size() * 3) rebuild_index();
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = home(hash);
  while (slots_[i].block != kNone && slots_[i].block != kGone) i = (i + 1) & mask;
  if (slots_[i].block == kGone) --gone_;
  slots_[i] = {hash, block};
  ++cached_;
}

void BlockPool::index_erase(BlockHash hash) noexcept {
  const std::size_t at = find_slot(hash);
  if (at == kNoSlot) return;
  slots_[at].block = kGone;
  --cached_;
  ++gone_;
}

void BlockPool::rebuild_index() noexcept {
  std::swap(slots_, spare_);
  std::fill(slots_.begin(), slots_.end(), Slot{});
  const std::size_t mask = slots_.size() - 1;
  for (const Slot& e : spare_) {
    if (e.block == kNone || e.block == kGone) continue;
    std::size_t i = home(e.hash);
    while (slots_[i].block != kNone) i = (i + 1) & mask;
    slots_[i] = e;
  }
  gone_ = 0;
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

bool BlockPool::allocate(std::int64_t n, std::vector<BlockId>& into) {
  NUMESH_CHECK(n >= 0, ValueError, "allocate: {} blocks", n);
  if (n > free_blocks()) return false;
  // Room first (none needed when the caller reserved it), so that nothing below can throw.
  const std::size_t wanted = into.size() + static_cast<std::size_t>(n);
  if (into.capacity() < wanted) into.reserve(std::max(wanted, 2 * into.capacity()));
  for (std::int64_t i = 0; i < n; ++i) {
    const BlockId b = head_;
    unlink_free(b);
    const auto ub = static_cast<std::size_t>(b);
    if (hash_of_[ub]) {  // evicted: its prefix is forgotten
      index_erase(*hash_of_[ub]);
      hash_of_[ub].reset();
    }
    refs_[ub] = 1;
    into.push_back(b);
  }
  return true;
}

void BlockPool::release(std::span<const BlockId> blocks) {
  // Checked whole first, counting a block listed twice, so that a bad call releases nothing.
  const auto clear = [&] {
    for (const BlockId b : blocks) {
      if (b >= 1 && b < static_cast<BlockId>(refs_.size()))
        dropping_[static_cast<std::size_t>(b)] = 0;
    }
  };
  try {
    for (const BlockId b : blocks) {
      check_held(b, "release");
      const std::int32_t dropped = ++dropping_[static_cast<std::size_t>(b)];
      NUMESH_CHECK(dropped <= refs_[static_cast<std::size_t>(b)], IndexError,
                   "release: block {} is held {} times, released {}", b,
                   refs_[static_cast<std::size_t>(b)], dropped);
    }
  } catch (...) {
    clear();
    throw;
  }
  clear();
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    if (--refs_[static_cast<std::size_t>(*it)] == 0) push_free(*it);
  }
}

std::optional<BlockId> BlockPool::hit(BlockHash hash) {
  const std::size_t at = find_slot(hash);
  if (at == kNoSlot) return std::nullopt;
  const BlockId b = slots_[at].block;
  const auto ub = static_cast<std::size_t>(b);
  if (refs_[ub] == 0) unlink_free(b);
  ++refs_[ub];
  return b;
}

void BlockPool::publish(BlockId block, BlockHash hash) {
  check_held(block, "publish");
  const auto ub = static_cast<std::size_t>(block);
  if (hash_of_[ub] || find_slot(hash) != kNoSlot) return;
  index_insert(hash, block);
  hash_of_[ub] = hash;
}

}  // namespace numesh::models
