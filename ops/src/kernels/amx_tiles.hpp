#pragma once

// PRIVATE to ops/src/kernels: what the AMX kernels (packed_gemm_q8.cpp's int8 tiles,
// dot_gemm_amx.cpp's bf16 ones) share: ldtilecfg's operand, and loading it and the tiles' inputs
// past GCC 12's intrinsics, which do not tell the compiler what memory they read.

#include <immintrin.h>

#include <cstdint>

namespace numesh::ops::detail {

/// ldtilecfg's operand, palette 1: each tile's bytes a row and rows (unused tiles zero).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t row_bytes[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

/// Loads `config` (ldtilecfg) on the calling thread. GCC 12's _tile_loadconfig tells the compiler
/// it reads 8 bytes of the 64, which let it drop the stores that filled the rest (a fault at the
/// first tile load): all 64 are made visible first.
__attribute__((target("amx-tile"))) inline void load_tile_config(const TileConfig& config) {
  __asm__ volatile("" : : "m"(config));
  _tile_loadconfig(&config);
}

/// Makes the stores before it visible to a tile load from `p`: GCC 12's _tile_loadd is an asm
/// without a memory operand, so stores into a buffer that only tile loads read could otherwise
/// be taken for dead.
inline void visible_to_tiles(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

}  // namespace numesh::ops::detail
