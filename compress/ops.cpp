#include "ops.hpp"

#include <algorithm>

#include "../kernels/cpu.hpp"
#include "../kernels/error.hpp"

namespace sketchsgd::ops {
namespace cu = kernels::cuda;
namespace cpu = kernels::cpu;

namespace {
/// Host list → device copy (the host list itself on the CPU).
template <class T>
const T* staged(const Device& d, std::span<const T> host, Buffer<T>& buf) {
  if (!d.is_gpu()) return host.data();
  buf = Buffer<T>(host.size(), d);
  buf.upload(host);
  return buf.data();
}
}  // namespace

size_t find_nonfinite(const Device& d, std::span<const float> x) {
  if (!d.is_gpu()) return cpu::find_nonfinite(x.data(), x.size());
  Buffer<unsigned long long> flag(1, d);
  const unsigned long long none = ~0ull;
  flag.upload(std::span<const unsigned long long>(&none, 1));
  cu::find_nonfinite(x.data(), x.size(), flag.data(), d.stream);
  const unsigned long long got = flag.to_vector()[0];
  return got == ~0ull ? kernels::kNone : size_t(got);
}

void axpy(const Device& d, std::span<float> y, std::span<const float> x, float a) {
  if (d.is_gpu())
    cu::axpy(y.data(), x.data(), y.size(), a, d.stream);
  else
    cpu::axpy(y.data(), x.data(), y.size(), a);
}

void scale(const Device& d, std::span<float> y, float a) {
  if (d.is_gpu())
    cu::scale(y.data(), y.size(), a, d.stream);
  else
    cpu::scale(y.data(), y.size(), a);
}

void momentum_accumulate(const Device& d, std::span<float> u, std::span<float> v,
                         std::span<const float> g, float rho) {
  if (d.is_gpu())
    cu::momentum_accumulate(u.data(), v.data(), g.data(), g.size(), rho, d.stream);
  else
    cpu::momentum_accumulate(u.data(), v.data(), g.data(), g.size(), rho);
}


void zero_at(const Device& d, std::span<float> y, std::span<const uint32_t> idx) {
  Buffer<uint32_t> di;
  const uint32_t* p = staged(d, idx, di);
  if (d.is_gpu())
    cu::zero_at(y.data(), p, idx.size(), d.stream);
  else
    cpu::zero_at(y.data(), p, idx.size());
}

void write_sparse(const Device& d, std::span<float> y, std::span<const uint32_t> idx,
                  std::span<const float> val) {
  Buffer<uint32_t> di;
  Buffer<float> dv;
  const uint32_t* pi = staged(d, idx, di);
  const float* pv = staged(d, val, dv);
  if (d.is_gpu()) {
    cu::zero(y.data(), y.size_bytes(), d.stream);
    cu::scatter(y.data(), pi, pv, idx.size(), d.stream);
  } else {
    std::fill(y.begin(), y.end(), 0.0f);
    cpu::scatter(y.data(), pi, pv, idx.size());
  }
}

void add_sparse(const Device& d, std::span<float> y, std::span<const uint32_t> idx,
                std::span<const float> val, float a) {
  Buffer<uint32_t> di;
  Buffer<float> dv;
  const uint32_t* pi = staged(d, idx, di);
  const float* pv = staged(d, val, dv);
  if (d.is_gpu())
    cu::scatter_axpy(y.data(), pi, pv, idx.size(), a, d.stream);
  else
    cpu::scatter_axpy(y.data(), pi, pv, idx.size(), a);
}

std::vector<float> gather(const Device& d, std::span<const float> x, std::span<const uint32_t> idx) {
  std::vector<float> out(idx.size());
  if (!d.is_gpu()) {
    cpu::gather(x.data(), idx.data(), idx.size(), out.data());
    return out;
  }
  Buffer<uint32_t> di;
  Buffer<float> dv(idx.size(), d);
  cu::gather(x.data(), staged(d, idx, di), idx.size(), dv.data(), d.stream);
  dv.download(out);
  return out;
}

void topk(const Device& d, std::span<const float> x, size_t k, std::vector<uint32_t>& idx,
          std::vector<float>& val, cu::Workspace& ws) {
  idx.resize(k);
  val.resize(k);
  if (!d.is_gpu()) {
    cpu::topk(x.data(), x.size(), k, idx.data(), val.data());
    return;
  }
  Buffer<uint32_t> di(k, d);
  Buffer<float> dv(k, d);
  cu::topk(x.data(), x.size(), k, di.data(), dv.data(), ws, d.stream);
  di.download(idx);
  dv.download(val);
}

std::vector<kernels::ChunkStats> chunk_stats(const Device& d, std::span<const float> x, size_t chunk) {
  std::vector<kernels::ChunkStats> out((x.size() + chunk - 1) / chunk);
  if (!d.is_gpu()) {
    cpu::chunk_stats(x.data(), x.size(), chunk, out.data());
    return out;
  }
  Buffer<kernels::ChunkStats> dev(out.size(), d);
  cu::chunk_stats(x.data(), x.size(), chunk, dev.data(), d.stream);
  dev.download(out);
  return out;
}

std::vector<uint32_t> pack_signs(const Device& d, std::span<const float> x) {
  std::vector<uint32_t> words((x.size() + 31) / 32);
  if (!d.is_gpu()) {
    cpu::pack_signs(x.data(), x.size(), words.data());
    return words;
  }
  Buffer<uint32_t> dev(words.size(), d);
  cu::pack_signs(x.data(), x.size(), dev.data(), d.stream);
  dev.download(words);
  return words;
}

void unpack_signs(const Device& d, std::span<const uint32_t> words, size_t chunk,
                  std::span<const float> scales, std::span<float> out, bool accumulate) {
  if (!d.is_gpu()) {
    cpu::unpack_signs(words.data(), out.size(), chunk, scales.empty() ? nullptr : scales.data(),
                      out.data(), accumulate);
    return;
  }
  Buffer<uint32_t> dw;
  Buffer<float> ds;
  const uint32_t* pw = staged(d, words, dw);
  const float* ps = scales.empty() ? nullptr : staged(d, scales, ds);
  cu::unpack_signs(pw, out.size(), chunk, ps, out.data(), accumulate, d.stream);
}

void ternarize(const Device& d, std::span<const float> x, size_t chunk, std::span<const float> scales,
               uint64_t seed, uint64_t stream, uint8_t* codes) {
  if (!d.is_gpu()) {
    cpu::ternarize(x.data(), x.size(), chunk, scales.data(), seed, stream, codes);
    return;
  }
  Buffer<float> ds;
  Buffer<uint8_t> dc((x.size() + 3) / 4, d);
  cu::ternarize(x.data(), x.size(), chunk, staged(d, scales, ds), seed, stream, dc.data(), d.stream);
  dc.download(std::span<uint8_t>(codes, dc.size()));
}

size_t unpack_ternary(const Device& d, std::span<const uint8_t> codes, size_t chunk,
                      std::span<const float> scales, float weight, std::span<float> out,
                      bool accumulate) {
  const float* hs = scales.empty() ? nullptr : scales.data();
  if (!d.is_gpu())
    return cpu::unpack_ternary(codes.data(), out.size(), chunk, hs, weight, out.data(), accumulate);
  Buffer<uint8_t> dc;
  Buffer<float> ds;
  Buffer<unsigned long long> flag(1, d);
  const unsigned long long none = ~0ull;
  flag.upload(std::span<const unsigned long long>(&none, 1));
  cu::unpack_ternary(staged(d, codes, dc), out.size(), chunk, hs ? staged(d, scales, ds) : nullptr,
                     weight, out.data(), accumulate, flag.data(), d.stream);
  const unsigned long long bad = flag.to_vector()[0];
  return bad == ~0ull ? kernels::kNone : size_t(bad);
}

std::span<const float> to_host(const Device& d, std::span<const float> x, std::vector<float>& staging) {
  if (!d.is_gpu()) return x;
  staging.resize(x.size());
  detail::copy_bytes(staging.data(), x.data(), x.size_bytes(), d);
  return staging;
}

}  // namespace sketchsgd::ops
