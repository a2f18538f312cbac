#include "powersgd_plan.hpp"

#include <algorithm>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::powersgd {

Plan::Plan(const Layout& layout, uint64_t rank, double min_rate, uint64_t blocks) {
  // Tensor j of the first chunk stands for its matrix: its rows are the block's times blocks.
  const auto& all = layout.tensors();
  SKETCHSGD_REQUIRE(all.size() % blocks == 0, InvalidArgument, "powersgd: blocks=", blocks,
                    " but the layout has ", all.size(), " tensors, not chunks of equal ones");
  const uint64_t per = all.size() / blocks, chunk = layout.size() / blocks;
  for (uint64_t i = 0; i < all.size(); ++i) {
    const auto& t = all[i];
    const auto& first = all[i % per];
    SKETCHSGD_REQUIRE(t.rows == first.rows && t.cols == first.cols && t.dims == first.dims &&
                          t.offset == first.offset + (i / per) * chunk,
                      InvalidArgument, "powersgd: blocks=", blocks, ": tensor ", i,
                      " of the layout differs from tensor ", i % per,
                      " of the first chunk (chunks of the same tensors expected)");
  }
  auto whole = [&](const Layout::Tensor& t) {
    const uint64_t rows = t.rows * blocks, r = std::min({rows, t.cols, rank});
    return t.dims < 2 || double(rows + t.cols) * double(r) * min_rate >= double(rows * t.cols);
  };
  for (uint64_t j = 0; j < per; ++j) {
    const auto& t = all[j];
    if (whole(t)) continue;
    const uint64_t rows = t.rows * blocks, r = std::min({rows, t.cols, rank});
    matrices.push_back({t.offset, rows, t.cols, r, p_size, q_size, r_size, blocks, chunk});
    p_size += rows * r;
    q_size += t.cols * r;
    r_size += r * r;
  }
  for (const auto& t : all)
    if (whole(t)) {
      dense.push_back({t.offset, t.numel, dense_size});
      dense_size += t.numel;
    }
}

}  // namespace sketchsgd::powersgd
