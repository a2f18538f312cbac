// The one device dispatch: every operation on vectors in a Device's memory runs the CPU kernels
// (cpu.hpp) or the CUDA kernels (cuda.hpp) from here, so that the count sketch and the codecs are
// written once and never ask where their memory lives. Staging and checks on a GPU go through the
// caller's Scratch. Vectors are in the device's memory; index lists decoded from messages are
// host vectors and are staged on the device where needed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/scratch.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::ops {

/// Index of the first NaN/±Inf, or kernels::kNone.
size_t find_nonfinite(const Device& d, Scratch& s, std::span<const float> x);
void axpy(const Device& d, std::span<float> y, std::span<const float> x, float a);
void scale(const Device& d, std::span<float> y, float a);
/// y = a · x (y may be x)
void scale(const Device& d, std::span<float> y, std::span<const float> x, float a);
/// dst = a · src for every piece (a = 1: a copy, bit for bit), in the device's memory: on a GPU
/// one launch per kernels::cuda::kMaxPieces pieces where a copy or scale each would be one.
void scale_pieces(const Device& d, std::span<const kernels::Piece> pieces, float a);
/// dst = src, both in the device's memory (on a GPU ordered on its stream, not waited for).
void copy(const Device& d, std::span<float> dst, std::span<const float> src);
/// Rounds x in place to the nearest fp16 (bf16: bfloat16) values; the index of the first value
/// that is then not finite (beyond fp16's range), or kernels::kNone.
size_t round_half(const Device& d, Scratch& s, std::span<float> x, bool bf16);
/// Deferred checks, for a caller that reads several at once: find_nonfinite's and round_half's
/// first position min'd into *flag (a word in d's memory preset to kernels::kNone) with no
/// read-back, so on a GPU the checks of a whole round cost one synchronisation (take_flags).
void flag_nonfinite(const Device& d, std::span<const float> x, unsigned long long* flag);
void round_half(const Device& d, std::span<float> x, bool bf16, unsigned long long* flag);
/// The flags' values into out (one read), then every flag preset to kernels::kNone again.
void take_flags(const Device& d, std::span<unsigned long long> flags,
                std::span<unsigned long long> out);
/// Every flag preset to kernels::kNone (on a GPU ordered on the stream, not waited for).
void clear_flags(const Device& d, std::span<unsigned long long> flags);
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
/// q = mᵀ·p for one matrix (m: rows × cols, p: rows × r, q: cols × r; row-major, d's memory).
void lowrank_answer(const Device& d, const float* m, const float* p, float* q, size_t rows,
                    size_t cols, size_t r);
/// c = a·bᵀ (a: rows × r, b: cols × r), and m −= a·bᵀ where m is given (c may then be null);
/// streamed: c is memory read only later (kernels::cpu::lowrank_expand's; the CPU's alone).
void lowrank_expand(const Device& d, const float* a, const float* b, float* c, size_t rows,
                    size_t cols, size_t r, float* m, bool streamed = false);
/// Whether d runs kernels::cpu::lowrank_absorb, the error feedback fused into the first product
/// in one pass (the CPU, where both are bound by memory); elsewhere it is the feedback's own
/// absorb and a gemm.
inline bool fuses_lowrank_absorb(const Device& d) {
  return !d.is_gpu();
}
/// u = ρ·u + g; v += u.
void momentum_accumulate(const Device& d, std::span<float> u, std::span<float> v,
                         std::span<const float> g, float rho);
/// Adagrad's step at every coordinate (elem::adagrad): v += s²; w −= lr · s / (√v + ε).
void adagrad(const Device& d, std::span<float> w, std::span<float> v, std::span<const float> s,
             float lr, float eps);
/// Adam's step at every coordinate (elem::adam), c1 and c2 its bias corrections.
void adam(const Device& d, std::span<float> w, std::span<float> m, std::span<float> v,
          std::span<const float> s, float lr, float b1, float b2, float c1, float c2, float eps);
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
/// The k largest |x| on the host, ordered (|x| desc, index asc) or by index.
void topk(const Device& d, Scratch& s, std::span<const float> x, size_t k,
          std::vector<uint32_t>& idx, std::vector<float>& val,
          kernels::Order order = kernels::Order::Magnitude);
// ---- quantisation (x in device memory; codes, words and scales on the host) ---------------------
/// Per-chunk statistics of x.
std::vector<kernels::ChunkStats> chunk_stats(const Device& d, Scratch& s, std::span<const float> x,
                                             size_t chunk);
/// The delta coding of strictly increasing indices (cpu::delta_encode's format), in d's memory
/// (scratch slot 0).
std::span<const uint8_t> delta_encode(const Device& d, Scratch& s, std::span<const uint32_t> idx);
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
/// A host vector in the device's memory: staged in `room` on a GPU (grown as needed), the vector
/// itself on the CPU (no copy).
template <class T>
std::span<const T> on_device(const Device& d, std::span<const T> host, Buffer<T>& room) {
  if (!d.is_gpu()) return host;
  if (room.size() < host.size()) room = Buffer<T>(host.size(), d);
  room.upload(host);
  return room.span().first(host.size());
}
/// x[i], read back to the host (error messages).
template <class T>
T value_at(const Device& d, std::span<const T> x, size_t i) {
  T v{};
  detail::copy_bytes(&v, x.data() + i, sizeof(T), d);
  return v;
}
/// Whether spans on d are host memory, which a message can be written into in place (the
/// framework's one decision by place: it saves a copy, the results are the same).
inline bool host_memory(const Device& d) {
  return !d.is_gpu();
}

// ---- count sketch (kernels::SketchLayout; the table in the device's memory) -------------------
/// Words precompute() writes for `l` on d: random buckets rows × dim; blocked rows × ⌈dim / B⌉
/// window words, and on a GPU the grouping by window after them where the shape takes it.
size_t precomputed_words(const Device& d, const kernels::SketchLayout& l);
/// The packed hashes (blocked layouts: the window words, then on a GPU their grouping) of `l` into
/// out (precomputed_words(d, l) words), waited for.
void precompute(const Device& d, const kernels::SketchLayout& l, uint32_t* out);
/// `l` with its precomputed words (precompute()'s out) in place: packed, or windows and order.
kernels::SketchLayout with_precomputed(const Device& d, kernels::SketchLayout l,
                                       const uint32_t* words);
/// table += scale · S(x) for the slice x at `offset`, all or nothing: where x holds a non-finite
/// value the table is taken back (zeroed when `was_empty`: exact) and its index returned, else
/// kernels::kNone.
size_t sketch_add(const Device& d, Scratch& s, const kernels::SketchLayout& l, float* table,
                  std::span<const float> x, uint64_t offset, float scale, bool was_empty);
/// Index of the first idx[i] ≥ dim, or kernels::kNone.
size_t find_out_of_range(const Device& d, Scratch& s, std::span<const uint32_t> idx, uint64_t dim);
void zero_buckets(const Device& d, const kernels::SketchLayout& l, float* table,
                  std::span<const uint32_t> idx);
void estimate(const Device& d, const kernels::SketchLayout& l, const float* table,
              std::span<const uint32_t> idx, std::span<float> out);
void estimate_all(const Device& d, const kernels::SketchLayout& l, const float* table,
                  std::span<float> out);
/// The k = idx.size() largest estimates into idx and val (device memory), by magnitude or index.
void estimate_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                   std::span<uint32_t> idx, std::span<float> val,
                   kernels::Order order = kernels::Order::Magnitude);
/// The same on the host, in the order asked for.
void estimate_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                   size_t k, kernels::Order order, std::vector<uint32_t>& idx,
                   std::vector<float>& val);
/// The k = idx.size() largest estimates in index order (device memory), and every bucket they
/// hash to zeroed in each of `reset` (tables of the same layout; FetchSGD's selection). Index
/// order: what the update carries, and where a one-row sketch on the CPU selects without
/// estimating every coordinate.
void extract_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                  std::span<float* const> reset, std::span<uint32_t> idx, std::span<float> val);
/// The same with the k results on the host.
void extract_topk(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table,
                  size_t k, std::span<float* const> reset, std::vector<uint32_t>& idx,
                  std::vector<float>& val);
double l2_estimate(const Device& d, Scratch& s, const kernels::SketchLayout& l, const float* table);
/// dst (on `to`) = src (on `from`), waited for; either device may be a GPU.
void copy_across(const Device& from, const Device& to, float* dst, const float* src, size_t n);

}  // namespace sketchsgd::ops
