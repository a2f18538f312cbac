// Vector operations on a Device: the CPU kernels or the CUDA kernels, so that codecs are written
// once. Staging and checks on a GPU go through the caller's Scratch. Vectors are in the device's
// memory; index lists decoded from messages are host vectors and are staged on the device where
// needed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/scratch.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::ops {

/// Index of the first NaN/±Inf, or kernels::kNone.
size_t find_nonfinite(const Device& d, Scratch& s, std::span<const float> x);
void axpy(const Device& d, std::span<float> y, std::span<const float> x, float a);
void scale(const Device& d, std::span<float> y, float a);
/// dst = src, both in the device's memory (on a GPU ordered on its stream, not waited for).
void copy(const Device& d, std::span<float> dst, std::span<const float> src);
/// Rounds x in place to the values a wire format carries (fp32: unchanged, unchecked); the index
/// of the first value that is then not finite (beyond fp16's range), or kernels::kNone.
size_t round_to(const Device& d, Scratch& s, std::span<float> x, WireFloat f);
/// Row-major c = alpha · op(a) · op(b) + beta · c (kernels::cpu::gemm), matrices in d's memory.
void gemm(const Device& d, bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
          const float* a, size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc);
/// The factors of a concatenation of row-major blocks (low-rank codecs), kept on the host and,
/// for a GPU, in its memory.
struct Factors {
  Factors(std::vector<kernels::Factor> list, const Device& d);
  std::vector<kernels::Factor> host;
  Buffer<kernels::Factor> device;  // empty on the CPU
};
/// kernels::cpu::orthonormalize of every factor of base; rr (device memory, when given) receives
/// each one's R.
void orthonormalize(const Device& d, Scratch& s, std::span<float> base, const Factors& f,
                    float* rr = nullptr);
/// u = ρ·u + g; v += u.
void momentum_accumulate(const Device& d, std::span<float> u, std::span<float> v,
                         std::span<const float> g, float rho);
/// y[idx] = 0 and z[idx] = 0 (host indices; either vector may be empty), the indices staged once.
void zero_at(const Device& d, Scratch& s, std::span<float> y, std::span<float> z,
             std::span<const uint32_t> idx);
/// y = 0 except y[idx[i]] = val[i] (host lists).
void write_sparse(const Device& d, Scratch& s, std::span<float> y, std::span<const uint32_t> idx,
                  std::span<const float> val);
/// y[idx[i]] += a · val[i] (host lists).
void add_sparse(const Device& d, Scratch& s, std::span<float> y, std::span<const uint32_t> idx,
                std::span<const float> val, float a);
/// x[idx] on the host.
std::vector<float> gather(const Device& d, Scratch& s, std::span<const float> x,
                          std::span<const uint32_t> idx);
/// The k largest |x|, ordered (|x| desc, index asc), on the host.
void topk(const Device& d, Scratch& s, std::span<const float> x, size_t k,
          std::vector<uint32_t>& idx, std::vector<float>& val);
// ---- quantisation (x in device memory; codes, words and scales on the host) ---------------------
/// Per-chunk statistics of x.
std::vector<kernels::ChunkStats> chunk_stats(const Device& d, Scratch& s, std::span<const float> x,
                                             size_t chunk);
/// 32 signs per word (cpu::pack_signs's format).
std::vector<uint32_t> pack_signs(const Device& d, Scratch& s, std::span<const float> x);
/// out (+)= scales[j / chunk] · sign bit j (scales empty: 1).
void unpack_signs(const Device& d, Scratch& s, std::span<const uint32_t> words, size_t chunk,
                  std::span<const float> scales, std::span<float> out, bool accumulate);
/// TernGrad codes into codes (host, (n + 3) / 4 bytes).
void ternarize(const Device& d, Scratch& s, std::span<const float> x, size_t chunk,
               std::span<const float> scales, uint64_t seed, uint64_t stream, uint8_t* codes);
/// out (+)= weight · scale · value(code); nothing written and the first bad position returned
/// when a code is invalid, else kernels::kNone.
size_t unpack_ternary(const Device& d, Scratch& s, std::span<const uint8_t> codes, size_t chunk,
                      std::span<const float> scales, float weight, std::span<float> out,
                      bool accumulate);

/// Host copy of a vector in the device's memory (the span itself on the CPU: no copy).
std::span<const float> to_host(const Device& d, std::span<const float> x,
                               std::vector<float>& staging);

}  // namespace sketchsgd::ops
