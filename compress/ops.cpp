#include "ops.hpp"

#include <algorithm>
#include <utility>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/half.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/cuda.hpp>

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
  if (d.is_gpu())
    cu::scale(y.data(), y.size(), a, d.stream);
  else
    cpu::scale(y.data(), y.size(), a);
}

void copy(const Device& d, std::span<float> dst, std::span<const float> src) {
  SKETCHSGD_ASSERT(dst.size() == src.size(), "copy of ", src.size(), " values into ", dst.size());
  if (d.is_gpu()) {
    gpu::copy_async(dst.data(), src.data(), src.size_bytes(), d.stream);
  } else if (!src.empty()) {
    std::copy(src.begin(), src.end(), dst.begin());
  }
}

size_t round_to(const Device& d, Scratch& s, std::span<float> x, WireFloat f) {
  if (f == WireFloat::F32) return kernels::kNone;
  const bool bf16 = f == WireFloat::BF16;
  if (d.is_gpu())
    return s.first_flagged(d, [&](unsigned long long* flag) {
      cu::round_half(x.data(), x.size(), bf16, flag, d.stream);
    });
  for (auto& v : x) v = bf16 ? bf16_float(bf16_bits(v)) : half_float(half_bits(v));
  return cpu::find_nonfinite(x.data(), x.size());
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

void momentum_accumulate(const Device& d, std::span<float> u, std::span<float> v,
                         std::span<const float> g, float rho) {
  if (d.is_gpu())
    cu::momentum_accumulate(u.data(), v.data(), g.data(), g.size(), rho, d.stream);
  else
    cpu::momentum_accumulate(u.data(), v.data(), g.data(), g.size(), rho);
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
          std::vector<uint32_t>& idx, std::vector<float>& val) {
  idx.resize(k);
  val.resize(k);
  if (!d.is_gpu()) {
    cpu::topk(x.data(), x.size(), k, idx.data(), val.data());
    return;
  }
  uint32_t* di = s.room<uint32_t>(d, k, 0);
  float* dv = s.room<float>(d, k, 1);
  cu::topk(x.data(), x.size(), k, di, dv, s.workspace(), d.stream);
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

}  // namespace sketchsgd::ops
