#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

// The blocks of a paged KV cache: every layer's keys and values live in fixed-size blocks of
// tokens, and a sequence holds a list of them (its block table) that grows block by block.
// The pool hands blocks out, counts the sequences holding each, takes them back, and
// remembers which full blocks hold which prefix of tokens so that a prompt starting with a
// cached prefix reuses them (prefix caching, as vLLM's block_pool.py does).

namespace numesh::models {

/// A block's index in the paged caches.
using BlockId = std::int32_t;

/// The hash of a full block of tokens and of everything before it in its sequence
/// (block_hash), the key of the prefix cache.
using BlockHash = std::uint64_t;

/// The hash of `tokens` (one full block) following a prefix whose last block hashed to
/// `parent` (0 for the first block). Equal prefixes give equal hashes on every run (FNV-1a
/// over the parent and the tokens' 32-bit values, not std::hash).
[[nodiscard]] BlockHash block_hash(BlockHash parent, std::span<const std::int32_t> tokens) noexcept;

/// The blocks: held ones with their reference counts, free ones in eviction order (the least
/// recently released first), and the full blocks that hold a known prefix, held or free. A
/// free block keeps its prefix until it is handed out again, so a finished conversation's
/// blocks serve the next turn unless the cache needed them meanwhile.
/// Block 0 is the scratch block: never handed out, it is where padding tokens write.
/// Not thread-safe: the engine's thread owns it.
class BlockPool {
 public:
  /// A pool of `blocks` blocks, block 0 the scratch one.
  /// Throws: ValueError when blocks < 2 (naming it).
  explicit BlockPool(std::int64_t blocks);

  /// Blocks in all, the scratch block included.
  [[nodiscard]] std::int64_t blocks() const noexcept {
    return static_cast<std::int64_t>(refs_.size());
  }
  /// Blocks allocate() can hand out now (free ones, cached prefixes or not).
  [[nodiscard]] std::int64_t free_blocks() const noexcept {
    return static_cast<std::int64_t>(free_.size());
  }
  /// Blocks some sequence holds.
  [[nodiscard]] std::int64_t used_blocks() const noexcept { return blocks() - 1 - free_blocks(); }
  /// Full blocks whose prefix is known (held or free).
  [[nodiscard]] std::int64_t cached_blocks() const noexcept {
    return static_cast<std::int64_t>(by_hash_.size());
  }
  /// Sequences holding `block` (0 when free).
  /// Throws: IndexError for a block outside [1, blocks()).
  [[nodiscard]] std::int32_t ref_count(BlockId block) const;

  /// `n` blocks, each held once, the least recently released first (a cached prefix they held
  /// is forgotten); nullopt, taking nothing, when fewer than n are free.
  /// Throws: ValueError for n < 0.
  [[nodiscard]] std::optional<std::vector<BlockId>> allocate(std::int64_t n);
  /// Drops one hold on each block; a block no sequence holds any more is free again, keeping
  /// its prefix. Blocks are released last to first, so a sequence's tail is evicted before its
  /// head (a shared head is the likelier hit).
  /// Throws: IndexError for a block outside [1, blocks()) or not held; nothing is released then.
  void release(std::span<const BlockId> blocks);

  /// The block holding the full block of tokens with this hash, now held once more (taken off
  /// the free list if it was free); nullopt when no block holds it.
  [[nodiscard]] std::optional<BlockId> hit(BlockHash hash);
  /// Records that the held `block` now holds the full block of tokens with `hash`. A hash
  /// another block already holds is left to that block (two sequences computed the same
  /// prefix at once; the later one's block stays unpublished).
  /// Throws: IndexError for a block outside [1, blocks()) or not held.
  void publish(BlockId block, BlockHash hash);

 private:
  void check_held(BlockId block, const char* call) const;
  std::vector<std::int32_t> refs_;                   // by block; block 0 unused
  std::list<BlockId> free_;                          // eviction order: front goes first
  std::vector<std::list<BlockId>::iterator> where_;  // a free block's place in free_
  std::vector<std::optional<BlockHash>> hash_of_;    // by block: the prefix it holds
  std::unordered_map<BlockHash, BlockId> by_hash_;
};

}  // namespace numesh::models
