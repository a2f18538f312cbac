// PowerSGD's plan of a layout (powersgd.cpp): which tensors are factored at the codec's rank and
// where their P, Q and R factors lie in the concatenated factors, which travel uncompressed.
#pragma once

#include <cstdint>
#include <vector>

#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::powersgd {

/// Where every tensor of the layout goes: matrices factored at their rank (P and Q at offsets in
/// the concatenated factors), the rest copied into the uncompressed part.
struct Plan {
  struct Matrix {
    uint64_t offset, rows, cols, rank, p_at, q_at, r_at;  // r_at: its rank × rank block
    // Its rows in `blocks` blocks, block b at offset + b · stride (blocks = 1: one block).
    uint64_t blocks = 1, stride = 0;

    /// f(its offset, its P rows' offset, its rows) for each block, in order.
    template <class F>
    void each_block(F&& f) const {
      const uint64_t n = rows / blocks;
      for (uint64_t b = 0; b < blocks; ++b) f(offset + b * stride, p_at + b * n * rank, n);
    }
  };
  struct Dense {
    uint64_t offset, numel, at;
  };
  std::vector<Matrix> matrices;
  std::vector<Dense> dense;
  uint64_t p_size = 0, q_size = 0, dense_size = 0, r_size = 0;

  /// The P (rows × rank) or Q (cols × rank) factor of every matrix, for ops::orthonormalize.
  std::vector<kernels::Factor> factors(bool q_side) const {
    std::vector<kernels::Factor> out;
    for (const auto& m : matrices)
      out.push_back({q_side ? m.q_at : m.p_at, q_side ? m.cols : m.rows, m.rank, m.r_at});
    return out;
  }

  /// Matrices worth factoring at `rank` ((rows + cols)·r·min_rate < rows·cols), of a layout of
  /// `blocks` chunks of the same tensors (FSDP's sharded layout: a matrix's row blocks one a
  /// chunk). InvalidArgument for a layout that is not such chunks.
  Plan(const Layout& layout, uint64_t rank, double min_rate, uint64_t blocks);
};

}  // namespace sketchsgd::powersgd
