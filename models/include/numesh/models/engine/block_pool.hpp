#pragma once

#include <cstdint>
#include <optional>
#include <span>
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
/// Every structure is sized for the pool when it is made: handing out, taking back, hitting
/// and publishing allocate nothing (a serving step's growth stays off the heap).
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
  [[nodiscard]] std::int64_t free_blocks() const noexcept { return free_count_; }
  /// Blocks some sequence holds.
  [[nodiscard]] std::int64_t used_blocks() const noexcept { return blocks() - 1 - free_blocks(); }
  /// Full blocks whose prefix is known (held or free).
  [[nodiscard]] std::int64_t cached_blocks() const noexcept { return cached_; }
  /// Sequences holding `block` (0 when free).
  /// Throws: IndexError for a block outside [1, blocks()).
  [[nodiscard]] std::int32_t ref_count(BlockId block) const;

  /// Appends `n` blocks to `into`, each held once, the least recently released first (a cached
  /// prefix they held is forgotten); false, taking nothing, when fewer than n are free.
  /// Allocates only if `into` must grow past its capacity.
  /// Throws: ValueError for n < 0.
  [[nodiscard]] bool allocate(std::int64_t n, std::vector<BlockId>& into);
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
  static constexpr BlockId kNone = -1;  // free list ends; an empty index slot
  static constexpr BlockId kGone = -2;  // an index slot whose entry was erased

  void check_held(BlockId block, const char* call) const;
  // The free list, linked through next_ and prev_ by block (least recently released first).
  void push_free(BlockId block) noexcept;
  void unlink_free(BlockId block) noexcept;
  // The prefix index: open addressing with linear probing over a power-of-two table at least
  // twice the blocks; erased entries leave kGone until the table is rebuilt in place.
  static constexpr std::size_t kNoSlot = ~std::size_t{0};
  [[nodiscard]] std::size_t home(BlockHash hash) const noexcept;       // where probing starts
  [[nodiscard]] std::size_t find_slot(BlockHash hash) const noexcept;  // its slot, or kNoSlot
  void index_insert(BlockHash hash, BlockId block) noexcept;
  void index_erase(BlockHash hash) noexcept;
  void rebuild_index() noexcept;

  std::vector<std::int32_t> refs_;       // by block; block 0 unused
  std::vector<BlockId> next_, prev_;     // by block: its neighbours in the free list
  BlockId head_ = kNone, tail_ = kNone;  // the free list's first and last
  std::int64_t free_count_ = 0;
  std::vector<std::optional<BlockHash>> hash_of_;  // by block: the prefix it holds
  struct Slot {
    BlockHash hash = 0;
    BlockId block = kNone;
  };
  std::vector<Slot> slots_, spare_;  // the index, and its rebuild's room
  std::int64_t cached_ = 0, gone_ = 0;
  std::vector<std::int32_t> dropping_;  // release()'s count per block, all 0 between calls
};

}  // namespace numesh::models
