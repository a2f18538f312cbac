// The blocks of a blocked count sketch grouped by where their windows land: per row, per tile of
// columns, per chunk of coordinates. It lets the CUDA accumulate add columns instead of values
// (cuda/sketch.cu, the column path): one CTA per (row, tile) adds every block whose window starts
// in the tile into shared memory, in gradient order, then adds its region to the table once. The
// table then takes r · c · (1 + B/T) reductions in all instead of one per (row, value), which were
// the bound of adding values (r · d · 4 bytes of L2 reductions: 2.7 GB at d = 2^27, r = 5).
//
// Made once per sketch config and device, beside the window words (hash.hpp), from them alone:
// row i holds ⌈d / B⌉ block numbers by tile, then by chunk (stable: a tile's blocks ascend), then
// `first`, tiles · chunks + 1 positions: item (tile, chunk) is the blocks at positions
// first[tile · chunks + chunk] … first[tile · chunks + chunk + 1] − 1 of the row, so a slice of
// the gradient is a range of each tile's list.
#pragma once

#include <cstdint>

#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/hash.hpp>

namespace sketchsgd::kernels {

/// Where the grouping lives (device memory beside the window words) and its granularity.
struct WindowOrder {
  const uint32_t* words = nullptr;  ///< rows × OrderShape::per_row; null: no column path
  /// log2 of the coordinates per chunk: where a slice's blocks can start and end in a tile's list
  /// (a slice reads the lists of the chunks it overlaps).
  uint32_t chunk_shift = 23;
  uint32_t tile_shift = 13;  ///< log2 of the columns per tile (the CTA's region is T + B floats)
};

/// The grouping's dimensions for one sketch.
struct OrderShape {
  uint64_t blocks = 0;        ///< per row: ⌈dim / B⌉
  uint32_t block_shift = 0;   ///< log2 B
  uint32_t chunk_blocks = 0;  ///< log2 of the blocks per chunk
  uint64_t chunks = 0;        ///< per row
  uint32_t tiles = 0;         ///< per row: ⌈cols / T⌉
  uint32_t tile = 0;          ///< T, columns per tile
  uint32_t region = 0;   ///< floats a CTA holds: T + B (a window starting in the tile ends there)
  uint64_t per_row = 0;  ///< words per row: blocks + tiles · chunks + 1

  SKETCHSGD_HD constexpr uint64_t items() const { return chunks * tiles; }
};

SKETCHSGD_HD constexpr OrderShape order_shape(uint64_t dim, uint32_t cols, hash::Blocked b,
                                              WindowOrder o) {
  OrderShape s;
  s.block_shift = b.shift;
  s.blocks = (dim + b.size() - 1) >> b.shift;
  s.chunk_blocks = o.chunk_shift > b.shift ? o.chunk_shift - b.shift : 0;
  s.chunks = (s.blocks + (uint64_t(1) << s.chunk_blocks) - 1) >> s.chunk_blocks;
  s.tile = 1u << o.tile_shift;
  s.tiles = uint32_t((uint64_t(cols) + s.tile - 1) >> o.tile_shift);
  s.region = s.tile + b.size();
  s.per_row = s.blocks + s.items() + 1;
  return s;
}

/// Whether a sketch of this shape can take the column path: blocked, aligned windows of at least a
/// group of 4, a CTA's region of T + B floats within 44 KiB (the kernel's 4 KiB list beside it:
/// the 48 KiB of shared memory a launch gets without opting in), and a table wide enough that a
/// region wraps past the last column at most once.
SKETCHSGD_HD constexpr bool order_fits(uint32_t block, uint32_t cols, WindowOrder o) {
  if (block == 0 || o.tile_shift < 2 || o.tile_shift > 13) return false;
  const hash::Blocked b = hash::blocked_shape(block, cols);
  const uint64_t region = (uint64_t(1) << o.tile_shift) + b.size();
  return b.aligned && b.lanes == 3 && region <= 11264 && uint64_t(cols) >= region;
}

/// One contiguous piece of a region's flush: `len` floats from region position p to column `col`.
struct RegionPiece {
  uint32_t col;
  uint32_t len;
};

/// The piece of the region of the tile starting at column tile_col that begins at position p: the
/// region's columns run on from tile_col and wrap past the last column, as windows do.
SKETCHSGD_HD constexpr RegionPiece region_piece(uint32_t tile_col, uint32_t p, uint32_t region,
                                                uint32_t cols, uint32_t max_len) {
  const uint64_t at = uint64_t(tile_col) + p;
  const uint32_t col = uint32_t(at < cols ? at : at - cols);
  uint32_t len = region - p;
  if (len > cols - col) len = cols - col;
  if (len > max_len) len = max_len;
  return {col, len};
}

}  // namespace sketchsgd::kernels
