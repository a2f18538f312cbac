#include <sketchsgd/kernels/ops.hpp>

#include <algorithm>
#include <utility>
#include <vector>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/half.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/hash.hpp>

namespace sketchsgd::ops {
namespace cu = kernels::cuda;
namespace cpu = kernels::cpu;

namespace {

/// Host list → device copy in a slot (the host list itself on the CPU). Reuse is safe: every
/// upload into a slot is ordered on the stream after the kernels that read its last contents.
template <class T>
const T* staged(const Device& d, Scratch& s, std::span<const T> host, int slot) {
  if (!d.is_gpu()) return host.data();
  T* p = s.room<T>(d, host.size(), slot);
  detail::copy_bytes(p, host.data(), host.size_bytes(), d);
  return p;
}

}  // namespace

size_t find_nonfinite(const Device& d, Scratch& s, std::span<const float> x) {
  if (!d.is_gpu()) return cpu::find_nonfinite(x.data(), x.size());
  return s.first_flagged(
      d, [&](unsigned long long* flag) { cu::find_nonfinite(x.data(), x.size(), flag, d.stream); });
}

void axpy(const Device& d, std::span<float> y, std::span<const float> x, float a) {
  if (d.is_gpu())
    cu::axpy(y.data(), x.data(), y.size(), a, d.stream);
  else
    cpu::axpy(y.data(), x.data(), y.size(), a);
}

void gemm(const Device& d, bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
          const float* a, size_t lda, const float* b, size_t ldb, float beta, float* c,
          size_t ldc) {
  if (d.is_gpu())
    cu::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, d.stream);
  else
    cpu::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void scale(const Device& d, std::span<float> y, float a) {
  scale(d, y, y, a);
}

void scale(const Device& d, std::span<float> y, std::span<const float> x, float a) {
  SKETCHSGD_ASSERT(y.size() == x.size(), "scale of ", x.size(), " values into ", y.size());
  if (d.is_gpu())
    cu::scale(y.data(), x.data(), y.size(), a, d.stream);
  else
    cpu::scale(y.data(), x.data(), y.size(), a);
}

void scale_pieces(const Device& d, std::span<const kernels::Piece> pieces, float a) {
  if (d.is_gpu()) {
    for (size_t i = 0; i < pieces.size(); i += cu::kMaxPieces)
      cu::scale_pieces(pieces.subspan(i, std::min(cu::kMaxPieces, pieces.size() - i)), a, d.stream);
    return;
  }
  for (const auto& p : pieces) {
    if (a == 1.0f)
      std::copy(p.src, p.src + p.n, p.dst);
    else
      cpu::scale(p.dst, p.src, p.n, a);
  }
}

void copy(const Device& d, std::span<float> dst, std::span<const float> src) {
  SKETCHSGD_ASSERT(dst.size() == src.size(), "copy of ", src.size(), " values into ", dst.size());
  if (d.is_gpu()) {
    gpu::copy_async(dst.data(), src.data(), src.size_bytes(), d.stream);
  } else if (!src.empty()) {
    std::copy(src.begin(), src.end(), dst.begin());
  }
}

size_t round_half(const Device& d, Scratch& s, std::span<float> x, bool bf16) {
  if (d.is_gpu())
    return s.first_flagged(d, [&](unsigned long long* flag) {
      cu::round_half(x.data(), x.size(), bf16, flag, d.stream);
    });
  for (auto& v : x) v = bf16 ? bf16_float(bf16_bits(v)) : half_float(half_bits(v));
  return cpu::find_nonfinite(x.data(), x.size());
}

void flag_nonfinite(const Device& d, std::span<const float> x, unsigned long long* flag) {
  if (d.is_gpu())
    cu::find_nonfinite(x.data(), x.size(), flag, d.stream);
  else
    *flag = std::min<unsigned long long>(*flag, cpu::find_nonfinite(x.data(), x.size()));
}

void round_half(const Device& d, std::span<float> x, bool bf16, unsigned long long* flag) {
  if (d.is_gpu()) {
    cu::round_half(x.data(), x.size(), bf16, flag, d.stream);
    return;
  }
  Scratch unused;
  *flag = std::min<unsigned long long>(*flag, round_half(d, unused, x, bf16));
}

void take_flags(const Device& d, std::span<unsigned long long> flags,
                std::span<unsigned long long> out) {
  SKETCHSGD_ASSERT(out.size() == flags.size(), "take_flags: ", flags.size(), " flags into ",
                   out.size());
  detail::copy_bytes(out.data(), flags.data(), flags.size_bytes(), d);
  clear_flags(d, flags);
}

void clear_flags(const Device& d, std::span<unsigned long long> flags) {
  static_assert(kernels::kNone == ~0ull, "a flag preset to kNone is every byte 0xFF");
  if (d.is_gpu())
    gpu::fill(flags.data(), 0xFF, flags.size_bytes(), d.stream);
  else
    std::fill(flags.begin(), flags.end(), ~0ull);
}

Factors::Factors(std::vector<kernels::Factor> list, const Device& d) : host(std::move(list)) {
  if (d.is_gpu()) {
    device = Buffer<kernels::Factor>(host.size(), d);
    device.upload(host);
  }
}

void orthonormalize(const Device& d, Scratch& s, std::span<float> base, const Factors& f,
                    float* rr) {
  if (d.is_gpu())
    return cu::orthonormalize(base.data(), f.host, f.device.data(), rr, s.workspace(), d.stream);
  for (const auto& m : f.host)
    cpu::orthonormalize(base.data() + m.at, m.rows, m.rank, rr != nullptr ? rr + m.r_at : nullptr);
}

void lowrank_answer(const Device& d, const float* m, const float* p, float* q, size_t rows,
                    size_t cols, size_t r) {
  if (!d.is_gpu()) return cpu::lowrank_answer(m, p, q, rows, cols, r);
  cu::gemm(true, false, cols, r, rows, 1.0f, m, cols, p, r, 0.0f, q, r, d.stream);
}

void lowrank_expand(const Device& d, const float* a, const float* b, float* c, size_t rows,
                    size_t cols, size_t r, float* m, bool streamed) {
  if (!d.is_gpu()) return cpu::lowrank_expand(a, b, c, rows, cols, r, m, streamed);
  // Two products reading only the small factors: m − a·bᵀ is a GEMM with β = 1.
  if (c != nullptr) cu::gemm(false, true, rows, cols, r, 1.0f, a, r, b, r, 0.0f, c, cols, d.stream);
  if (m != nullptr)
    cu::gemm(false, true, rows, cols, r, -1.0f, a, r, b, r, 1.0f, m, cols, d.stream);
}

void momentum_accumulate(const Device& d, std::span<float> u, std::span<float> v,
                         std::span<const float> g, float rho) {
  if (d.is_gpu())
    cu::momentum_accumulate(u.data(), v.data(), g.data(), g.size(), rho, d.stream);
  else
    cpu::momentum_accumulate(u.data(), v.data(), g.data(), g.size(), rho);
}

void adagrad(const Device& d, std::span<float> w, std::span<float> v, std::span<const float> s,
             float lr, float eps) {
  if (d.is_gpu())
    cu::adagrad(w.data(), v.data(), s.data(), s.size(), lr, eps, d.stream);
  else
    cpu::adagrad(w.data(), v.data(), s.data(), s.size(), lr, eps);
}

void adam(const Device& d, std::span<float> w, std::span<float> m, std::span<float> v,
          std::span<const float> s, float lr, float b1, float b2, float c1, float c2, float eps) {
  if (d.is_gpu())
    cu::adam(w.data(), m.data(), v.data(), s.data(), s.size(), lr, b1, b2, c1, c2, eps, d.stream);
  else
    cpu::adam(w.data(), m.data(), v.data(), s.data(), s.size(), lr, b1, b2, c1, c2, eps);
}

void zero_at(const Device& d, Scratch& s, std::span<float> y, std::span<float> z,
             std::span<const uint32_t> idx) {
  if (idx.empty() || (y.empty() && z.empty())) return;
  const uint32_t* p = staged(d, s, idx, 0);
  for (const std::span<float> v : {y, z}) {
    if (v.empty()) continue;
    if (d.is_gpu())
      cu::zero_at(v.data(), p, idx.size(), d.stream);
    else
      cpu::zero_at(v.data(), p, idx.size());
  }
}

void write_sparse(const Device& d, Scratch& s, std::span<float> y, std::span<const uint32_t> idx,
                  std::span<const float> val) {
  const uint32_t* pi = staged(d, s, idx, 0);
  const float* pv = staged(d, s, val, 1);
  if (d.is_gpu()) {
    gpu::fill(y.data(), 0, y.size_bytes(), d.stream);
    cu::scatter(y.data(), pi, pv, idx.size(), d.stream);
  } else {
    std::fill(y.begin(), y.end(), 0.0f);
    cpu::scatter(y.data(), pi, pv, idx.size());
  }
}

void add_sparse(const Device& d, Scratch& s, std::span<float> y, std::span<const uint32_t> idx,
                std::span<const float> val, float a) {
  const uint32_t* pi = staged(d, s, idx, 0);
  const float* pv = staged(d, s, val, 1);
  if (d.is_gpu())
    cu::scatter_axpy(y.data(), pi, pv, idx.size(), a, d.stream);
  else
    cpu::scatter_axpy(y.data(), pi, pv, idx.size(), a);
}

std::vector<float> gather(const Device& d, Scratch& s, std::span<const float> x,
                          std::span<const uint32_t> idx) {
  std::vector<float> out(idx.size());
  if (!d.is_gpu()) {
    cpu::gather(x.data(), idx.data(), idx.size(), out.data());
    return out;
  }
  float* dv = s.room<float>(d, idx.size(), 1);
  cu::gather(x.data(), staged(d, s, idx, 0), idx.size(), dv, d.stream);
  detail::copy_bytes(out.data(), dv, out.size() * sizeof(float), d);
  return out;
}

void topk(const Device& d, Scratch& s, std::span<const float> x, size_t k,
          std::vector<uint32_t>& idx, std::vector<float>& val, kernels::Order order) {
  idx.resize(k);
  val.resize(k);
  if (!d.is_gpu()) {
    cpu::topk(x.data(), x.size(), k, idx.data(), val.data(), order);
    return;
  }
  uint32_t* di = s.room<uint32_t>(d, k, 0);
  float* dv = s.room<float>(d, k, 1);
  cu::topk(x.data(), x.size(), k, di, dv, s.workspace(), d.stream, order);
  detail::copy_bytes(idx.data(), di, k * sizeof(uint32_t), d);
  detail::copy_bytes(val.data(), dv, k * sizeof(float), d);
}

std::vector<kernels::ChunkStats> chunk_stats(const Device& d, Scratch& s, std::span<const float> x,
                                             size_t chunk) {
  std::vector<kernels::ChunkStats> out((x.size() + chunk - 1) / chunk);
  if (!d.is_gpu()) {
    cpu::chunk_stats(x.data(), x.size(), chunk, out.data());
    return out;
  }
  auto* dev = s.room<kernels::ChunkStats>(d, out.size(), 0);
  cu::chunk_stats(x.data(), x.size(), chunk, dev, d.stream);
  detail::copy_bytes(out.data(), dev, out.size() * sizeof(kernels::ChunkStats), d);
  return out;
}

std::span<const uint8_t> delta_encode(const Device& d, Scratch& s, std::span<const uint32_t> idx) {
  if (!d.is_gpu()) {
    const size_t n = cpu::delta_bytes(idx.data(), idx.size());
    uint8_t* out = s.room<uint8_t>(d, n, 0);
    cpu::delta_encode(idx.data(), idx.size(), out);
    return {out, n};
  }
  uint8_t* out = s.room<uint8_t>(d, 5 * idx.size(), 0);
  return {out, cu::delta_encode(idx.data(), idx.size(), out, s.workspace(), d.stream)};
}

std::vector<uint32_t> pack_signs(const Device& d, Scratch& s, std::span<const float> x) {
  std::vector<uint32_t> words((x.size() + 31) / 32);
  if (!d.is_gpu()) {
    cpu::pack_signs(x.data(), x.size(), words.data());
    return words;
  }
  uint32_t* dev = s.room<uint32_t>(d, words.size(), 0);
  cu::pack_signs(x.data(), x.size(), dev, d.stream);
  detail::copy_bytes(words.data(), dev, words.size() * sizeof(uint32_t), d);
  return words;
}

void unpack_signs(const Device& d, Scratch& s, std::span<const uint32_t> words, size_t chunk,
                  std::span<const float> scales, std::span<float> out, bool accumulate) {
  if (!d.is_gpu()) {
    cpu::unpack_signs(words.data(), out.size(), chunk, scales.empty() ? nullptr : scales.data(),
                      out.data(), accumulate);
    return;
  }
  const uint32_t* pw = staged(d, s, words, 0);
  const float* ps = scales.empty() ? nullptr : staged(d, s, scales, 1);
  cu::unpack_signs(pw, out.size(), chunk, ps, out.data(), accumulate, d.stream);
}

void ternarize(const Device& d, Scratch& s, std::span<const float> x, size_t chunk,
               std::span<const float> scales, uint64_t seed, uint64_t stream, uint8_t* codes) {
  if (!d.is_gpu()) {
    cpu::ternarize(x.data(), x.size(), chunk, scales.data(), seed, stream, codes);
    return;
  }
  const size_t nb = (x.size() + 3) / 4;
  uint8_t* dc = s.room<uint8_t>(d, nb, 0);
  cu::ternarize(x.data(), x.size(), chunk, staged(d, s, scales, 1), seed, stream, dc, d.stream);
  detail::copy_bytes(codes, dc, nb, d);
}

size_t unpack_ternary(const Device& d, Scratch& s, std::span<const uint8_t> codes, size_t chunk,
                      std::span<const float> scales, float weight, std::span<float> out,
                      bool accumulate) {
  const float* hs = scales.empty() ? nullptr : scales.data();
  if (!d.is_gpu())
    return cpu::unpack_ternary(codes.data(), out.size(), chunk, hs, weight, out.data(), accumulate);
  const uint8_t* dc = staged(d, s, codes, 0);
  const float* ds = hs ? staged(d, s, scales, 1) : nullptr;
  return s.first_flagged(d, [&](unsigned long long* flag) {
    cu::unpack_ternary(dc, out.size(), chunk, ds, weight, out.data(), accumulate, flag, d.stream);
  });
}

std::span<const float> to_host(const Device& d, std::span<const float> x,
                               std::vector<float>& staging) {
  if (!d.is_gpu()) return x;
  staging.resize(x.size());
  detail::copy_bytes(staging.data(), x.data(), x.size_bytes(), d);
  return staging;
}

namespace {
size_t window_words(const kernels::SketchLayout& l) {
  const hash::Blocked b = hash::blocked_shape(l.block, l.cols);
  return size_t(l.rows) * ((l.dim + b.size() - 1) >> b.shift);
}
}  // namespace

size_t precomputed_words(const Device& d, const kernels::SketchLayout& l) {
  if (!l.block) return size_t(l.rows) * l.dim;
  return window_words(l) + (d.is_gpu() ? cpu::order_words(l) : 0);
}

void precompute(const Device& d, const kernels::SketchLayout& l, uint32_t* out) {
  if (!d.is_gpu()) {
    if (l.block)
      cpu::precompute_windows(l, out);
    else
      cpu::precompute_hashes(l, out);
    return;
  }
  const auto scope = d.activate();
  if (l.block)
    cu::precompute_windows(l, out, d.stream);
  else
    cu::precompute_hashes(l, out, d.stream);
  if (const size_t n = l.block ? cpu::order_words(l) : 0) {
    // The grouping is a counting sort, made once per config and device: on the host, from the
    // same words (cpu::precompute_windows is bit-identical), then copied up.
    std::vector<uint32_t> words(window_words(l)), order(n);
    kernels::SketchLayout h = l;
    h.windows = words.data();
    cpu::precompute_windows(h, words.data());
    cpu::order_windows(h, order.data());
    detail::copy_bytes(out + words.size(), order.data(), n * sizeof(uint32_t), d);
  }
  gpu::synchronize(d.stream);
}

kernels::SketchLayout with_precomputed(const Device& d, kernels::SketchLayout l,
                                       const uint32_t* words) {
  if (!l.block) {
    l.packed = words;
    return l;
  }
  l.windows = words;
  l.order.words = d.is_gpu() && cpu::order_words(l) ? words + window_words(l) : nullptr;
  return l;
}

size_t sketch_add(const Device& d, Scratch& s, const kernels::SketchLayout& l, float* table,
                  std::span<const float> x, uint64_t offset, float scale, bool was_empty) {
  if (x.empty()) return kernels::kNone;
  const size_t cells = size_t(l.rows) * l.cols;
  if (d.is_gpu()) {
    // One pass adds the finite values and reports the first non-finite one; on a report, the
    // same pass with −scale takes the finite values back out.
    auto pass = [&](float a) {
      return s.first_flagged(d, [&](unsigned long long* flag) {
        cu::accumulate(l, table, x.data(), x.size(), offset, a, flag, d.stream);
      });
    };
    const size_t bad = pass(scale);
    if (bad != kernels::kNone) {
      if (was_empty)
        detail::zero_bytes(table, cells * sizeof(float), d);
      else
        pass(-scale);
    }
    return bad;
  }
  // The CPU pass stops at the first non-finite value: what came before it is taken back.
  const size_t stop = cpu::accumulate(l, table, x.data(), x.size(), offset, scale);
  if (stop == kernels::kNone) return stop;
  if (was_empty)
    std::fill(table, table + cells, 0.0f);
  else if (stop > 0)
    cpu::accumulate(l, table, x.data(), stop, offset, -scale);
  return stop + cpu::find_nonfinite(x.data() + stop, x.size() - stop);
}

size_t find_out_of_range(const Device& d, Scratch& s, std::span<const uint32_t> idx, uint64_t dim) {
  if (d.is_gpu())
    return s.first_flagged(d, [&](unsigned long long* flag) {
      cu::check_indices(idx.data(), idx.size(), dim, flag, d.stream);
    });
  for (size_t i = 0; i < idx.size(); ++i)
    if (idx[i] >= dim) return i;
  return kernels::kNone;
}

void zero_buckets(const Device& d, const kernels::SketchLayout& l, float* table,
                  std::span<const uint32_t> idx) {
  if (d.is_gpu())
    cu::zero_buckets(l, table, idx.data(), idx.size(), d.stream);
  else
    cpu::zero_buckets(l, table, idx.data(), idx.size());
}

void estimate(const Device& d, const kernels::SketchLayout& l, const float* table,
              std::span<const uint32_t> idx, std::span<float> out) {
  if (d.is_gpu())
    cu::estimate(l, table, idx.data(), idx.size(), out.data(), d.stream);
  else
    cpu::estimate(l, table, idx.data(), idx.size(), out.data());
}

void estimate_all(const Device& d, const kernels::SketchLayout& l, const float* table,
                  std::span<float> out) {
  if (d.is_gpu())
    cu::estimate_all(l, table, out.data(), d.stream);
  else
    cpu::estimate_all(l, table, out.data());
}

void estimate_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                   std::span<uint32_t> idx, std::span<float> val, kernels::Order order) {
  if (d.is_gpu())
    cu::estimate_topk(l, table, idx.size(), idx.data(), val.data(), s.workspace(), d.stream, order);
  else
    cpu::estimate_topk(l, table, idx.size(), idx.data(), val.data(), order);
}

void estimate_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                   size_t k, kernels::Order order, std::vector<uint32_t>& idx,
                   std::vector<float>& val) {
  idx.resize(k);
  val.resize(k);
  if (!d.is_gpu()) return cpu::estimate_topk(l, table, k, idx.data(), val.data(), order);
  // Result buffers kept across calls (a server asks every round).
  uint32_t* di = s.room<uint32_t>(d, k, 0);
  float* dv = s.room<float>(d, k, 1);
  cu::estimate_topk(l, table, k, di, dv, s.workspace(), d.stream, order);
  detail::copy_bytes(idx.data(), di, k * sizeof(uint32_t), d);
  detail::copy_bytes(val.data(), dv, k * sizeof(float), d);
}

void extract_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                  std::span<float* const> reset, std::span<uint32_t> idx, std::span<float> val) {
  estimate_topk(d, s, l, table, idx, val, kernels::Order::Index);
  for (float* t : reset) zero_buckets(d, l, t, idx);
}

void extract_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                  size_t k, std::span<float* const> reset, std::vector<uint32_t>& idx,
                  std::vector<float>& val) {
  idx.resize(k);
  val.resize(k);
  if (!d.is_gpu()) return extract_topk(d, s, l, table, reset, std::span(idx), std::span(val));
  uint32_t* di = s.room<uint32_t>(d, k, 0);
  float* dv = s.room<float>(d, k, 1);
  extract_topk(d, s, l, table, reset, {di, k}, {dv, k});
  detail::copy_bytes(idx.data(), di, k * sizeof(uint32_t), d);
  detail::copy_bytes(val.data(), dv, k * sizeof(float), d);
}

double l2_estimate(const Device& d, Scratch& s, const kernels::SketchLayout& l,
                   const float* table) {
  if (!d.is_gpu()) return cpu::l2_estimate(l, table);
  Buffer<double> out(1, d);
  cu::l2_estimate(l, table, out.data(), s.workspace(), d.stream);
  return out.to_vector()[0];
}

void copy_across(const Device& from, const Device& to, float* dst, const float* src, size_t n) {
  if (!from.is_gpu() && !to.is_gpu()) {
    std::copy(src, src + n, dst);
    return;
  }
  // Ordered after the source's queued work on its stream; gpu::copy waits before returning.
  const Device& g = from.is_gpu() ? from : to;
  const auto scope = g.activate();
  gpu::copy(dst, src, n * sizeof(float), g.stream);
}

}  // namespace sketchsgd::ops
