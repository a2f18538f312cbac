// CPU kernel entry points: the only place with raw loops over gradients. The CUDA backend declares
// the same entry points for device memory in cuda.hpp. Callers validate sizes; kernels trust them.
#pragma once

#include <cstddef>
#include <cstdint>

#include <sketchsgd/kernels/window_order.hpp>

namespace sketchsgd::kernels {

/// Where a count sketch's table lives and how coordinates hash into it.
struct SketchLayout {
  uint64_t dim = 0;   ///< coordinates hashed (≤ 2^32 − 1)
  uint32_t rows = 0;  ///< r
  uint32_t cols = 0;  ///< c
  uint64_t seed = 0;  ///< shared by every process that must agree on the hashes
  const uint32_t* packed =
      nullptr;  ///< optional precomputed packed hashes, rows × dim; null: on the fly
  /// Blocked hashing (hash.hpp): the configured block size (0: random buckets) and the window
  /// words, rows × ⌈dim / B⌉ with B = blocked_shape(block, cols).size() (required when blocked).
  uint32_t block = 0;
  const uint32_t* windows = nullptr;
  /// Blocked hashing on a GPU: the blocks grouped by window (window_order.hpp), optional.
  WindowOrder order{};
};

/// Summary statistics of one chunk of a vector (scalers for TernGrad and EF-signSGD).
struct ChunkStats {
  float abs_max;
  float abs_mean;
  float stddev;
};

inline constexpr size_t kNone = ~size_t(0);

/// How selections order their k results: |value| descending then index ascending (a total
/// order: ties resolve the same everywhere), or by index ascending (what sparse messages need).
/// Either way the same k are chosen.
enum class Order : uint8_t { Magnitude, Index };

/// One matrix of a concatenation of row-major n × r blocks (the factors of a low-rank codec):
/// its offset, rows and columns, and where its r × r R goes in a concatenation of those.
/// One run of a batched copy or scale (ops::scale_pieces): n floats from src to dst.
struct Piece {
  float* dst;
  const float* src;
  uint64_t n;
};

struct Factor {
  uint64_t at, rows, rank, r_at;
};

namespace cpu {

// ---- count sketch -------------------------------------------------------------------------------
/// Fills packed[row · dim + j] with the packed bucket and sign of every (row, coordinate).
void precompute_hashes(const SketchLayout& s, uint32_t* packed);
/// Fills words[row · ⌈dim / B⌉ + b] with the window word of every (row, block) (blocked hashing).
void precompute_windows(const SketchLayout& s, uint32_t* words);
/// Words of the grouping by window (window_order.hpp) for s.order's granularity; 0 where the shape
/// cannot take the column path.
size_t order_words(const SketchLayout& s);
/// Fills out (order_words(s) words) with the grouping of the window words s.windows (host memory).
void order_windows(const SketchLayout& s, uint32_t* out);

/// table += scale · S(x) for coordinates offset … offset + n − 1. Checks finiteness block by block
/// in the same pass; on a non-finite value it stops before that block and returns the block's
/// first coordinate (relative to x), leaving blocks before it accumulated. Returns kNone on
/// success.
size_t accumulate(const SketchLayout& s, float* table, const float* x, size_t n, uint64_t offset,
                  float scale);

/// out[i] = median over rows of sign · table[bucket] for coordinate idx[i].
void estimate(const SketchLayout& s, const float* table, const uint32_t* idx, size_t n, float* out);

/// out[j] for every coordinate j < dim.
void estimate_all(const SketchLayout& s, const float* table, float* out);

/// The k coordinates with the largest estimated magnitude, without materialising all estimates.
/// With one row under blocked hashing the k-th magnitude is found over the columns (each weighted
/// by the coordinates it holds) and one pass in index order collects the k, so Order::Index is
/// the cheaper order there.
void estimate_topk(const SketchLayout& s, const float* table, size_t k, uint32_t* idx, float* val,
                   Order order = Order::Magnitude);

/// Zeroes, in every row, the bucket each of the n coordinates idx hashes to (FetchSGD's reset).
void zero_buckets(const SketchLayout& s, float* table, const uint32_t* idx, size_t n);

/// sqrt(median over rows of Σ_col table[row][col]²): the sketch's estimate of ‖x‖₂.
double l2_estimate(const SketchLayout& s, const float* table);

// ---- selection ----------------------------------------------------------------------------------
/// The k largest |x[j]|, ordered as estimate_topk's. No full sort of x: a running threshold keeps
/// at most 2k candidates per thread, then nth_element.
void topk(const float* x, size_t n, size_t k, uint32_t* idx, float* val,
          Order order = Order::Magnitude);
/// Sorts n (index, value) pairs by index, equal indices by the value's bits (so the order never
/// depends on the input order); O(n) when the indices already increase.
void sort_pairs(uint32_t* idx, float* val, size_t n);

// ---- dense matrices (row-major; OpenBLAS) ----------------------------------------------------
/// c = alpha · op(a) · op(b) + beta · c with op(a) m × k and op(b) k × n (op = transpose when
/// asked); lda, ldb, ldc are the row strides of a, b, c as stored.
void gemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha, const float* a,
          size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc);
/// Orthonormalises the r columns of the n × r matrix a in place (Gram-Schmidt); a column
/// dependent on the earlier ones, or zero, becomes zero. rr, when given, receives the r × r
/// upper-triangular R (row-major) with a as it was = a as it is · R, to rounding.
void orthonormalize(float* a, size_t n, size_t r, float* rr = nullptr);

// ---- low-rank passes (PowerSGD), one streaming pass over a rows × cols matrix each ----------
/// Error feedback fused with the first product: x = g, or u = ρ·u + g and x = u when u is
/// given; m += x; p = m·q (q: cols × r, p: rows × r; r = 0: no product). Factors row-major.
/// With a (rows × r) and b (cols × r): m −= a·bᵀ before m += x, the error subtraction of the
/// last lowrank_expand deferred to this pass; m ends as it would after lowrank_expand(a, b, c,
/// ..., m) and this call without a and b. At ranks up to 4 it costs no pass over m of its own,
/// and no more reads at all when b is q (a subtraction rewritten on q's columns).
/// The gradient's finiteness check rides on the pass: where g is NaN or ±Inf, m (past the
/// subtraction) and u stay as they were; false when g held any such value (p is then
/// meaningless and the other values absorbed: callers that must refuse such a g with their state
/// untouched check it first, as the PowerSGD codec does).
bool lowrank_absorb(float* m, const float* g, float* u, float rho, const float* q, float* p,
                    size_t rows, size_t cols, size_t r, const float* a = nullptr,
                    const float* b = nullptr);
/// out = a·rᵀ (a: rows × k, r: k × k upper triangular, out: rows × k; row-major): a deferred
/// subtraction's left factor carried over to the columns of q before orthonormalisation.
void times_upper_transposed(const float* a, const float* r, float* out, size_t rows, size_t k);
/// q = mᵀ·p (m: rows × cols, p: rows × r, q: cols × r).
void lowrank_answer(const float* m, const float* p, float* q, size_t rows, size_t cols, size_t r);
/// c = a·bᵀ (a: rows × r, b: cols × r, c: rows × cols); m −= c as well when m is given (the
/// error feedback written out in the same pass). c may be null when m is given: only m −= a·bᵀ.
/// streamed: c written by streaming stores at ranks up to 4 (the same values), for memory that is
/// not in cache and is read only later (FSDP's output of a reduce-scatter): its lines are not
/// fetched before they are written, a read as long as the write. Past rank 4 the pass is bound by
/// the FMA units and c is stored as usual.
void lowrank_expand(const float* a, const float* b, float* c, size_t rows, size_t cols, size_t r,
                    float* m = nullptr, bool streamed = false);

// ---- dense vectors ------------------------------------------------------------------------------
/// Index of the first NaN/±Inf in x, or kNone.
size_t find_nonfinite(const float* x, size_t n);
/// y += a · x
void axpy(float* y, const float* x, size_t n, float a);
/// y *= a
void scale(float* y, size_t n, float a);
/// y = a · x (y may be x)
void scale(float* y, const float* x, size_t n, float a);
/// Momentum then error accumulation in one pass: u = ρ·u + g; v += u.
void momentum_accumulate(float* u, float* v, const float* g, size_t n, float rho);
/// elem::adagrad at every coordinate.
void adagrad(float* w, float* v, const float* s, size_t n, float lr, float eps);
/// elem::adam at every coordinate.
void adam(float* w, float* m, float* v, const float* s, size_t n, float lr, float b1, float b2,
          float c1, float c2, float eps);
/// Per-chunk |max|, mean |x| and standard deviation.
void chunk_stats(const float* x, size_t n, size_t chunk, ChunkStats* out);

// ---- sparse vectors -----------------------------------------------------------------------------
void gather(const float* x, const uint32_t* idx, size_t n, float* out);
void scatter(float* y, const uint32_t* idx, const float* val, size_t n);
void zero_at(float* y, const uint32_t* idx, size_t n);
/// y[idx[i]] += a · val[i]: the same arithmetic as axpy with a sparse x, so results agree bit for
/// bit.
void scatter_axpy(float* y, const uint32_t* idx, const float* val, size_t n, float a);

// ---- bit packing --------------------------------------------------------------------------------
/// 32 signs per word, bit j % 32 of word j / 32 set when x[j] < 0; padding bits zero.
void pack_signs(const float* x, size_t n, uint32_t* words);
/// out[j] (+)= scale[j / chunk] · (±1); scales null means 1. accumulate: add instead of store.
void unpack_signs(const uint32_t* words, size_t n, size_t chunk, const float* scales, float* out,
                  bool accumulate);
/// neg[j] += 1 for every set bit (majority-vote counting on the server).
void count_negative(const uint32_t* words, size_t n, uint32_t* neg);
/// Padding bits beyond n in the last word are zero (wire validation).
bool sign_padding_clear(const uint32_t* words, size_t n);

/// TernGrad: stochastic ternary rounding, four 2-bit codes per byte, scale per chunk; the random
/// stream is Philox4x32-10 keyed by seed, counter (j / 4, stream).
void ternarize(const float* x, size_t n, size_t chunk, const float* scales, uint64_t seed,
               uint64_t stream, uint8_t* codes);
/// Deterministic ternary codes of sign(x) (0 stays 0).
void pack_ternary(const float* x, size_t n, uint8_t* codes);
/// out[j] (+)= weight · scale[j / chunk] · value(code j); scales null means 1. Returns the first
/// position holding the invalid code 3 (or non-zero padding) without writing anything, else kNone.
size_t unpack_ternary(const uint8_t* codes, size_t n, size_t chunk, const float* scales,
                      float weight, float* out, bool accumulate);

/// QSGD: one norm per chunk of x (the L2 norm, or max |x| when !l2), accumulated in double.
void chunk_norms(const float* x, size_t n, size_t chunk, bool l2, float* norms);
/// QSGD codes of `bits` (2, 4 or 8) per value, 8 / bits a byte from the lowest bits up, padding
/// zero; norm per chunk; the random stream is Philox4x32-10 keyed by seed, counter (j / 4,
/// stream), as ternarize's.
void qsgd_pack(const float* x, size_t n, size_t chunk, const float* norms, uint32_t bits,
               uint64_t seed, uint64_t stream, uint8_t* codes);
/// out[j] (+)= weight · value(code j). Returns the first position holding a code qsgd_pack cannot
/// write (or non-zero padding) without writing anything, else kNone.
size_t qsgd_unpack(const uint8_t* codes, size_t n, size_t chunk, const float* norms, uint32_t bits,
                   float weight, float* out, bool accumulate);
/// The n values x as level codes (elem::level_code) of `bits` bits (2, 4 or 8) under one scale,
/// packed little-endian into ⌈n · bits / 8⌉ bytes; q (optional) gets the values they decode to.
void level_pack(const float* x, size_t n, float scale, uint32_t bits, uint8_t* codes, float* q);
/// out[i] = weight · the value of code i (level_pack's format; every code is valid).
void level_unpack(const uint8_t* codes, size_t n, float scale, uint32_t bits, float weight,
                  float* out);
/// Bytes the delta coding of n strictly increasing indices takes (elem::varint_bytes).
size_t delta_bytes(const uint32_t* idx, size_t n);
/// Writes that coding into out (delta_bytes(idx, n) bytes).
void delta_encode(const uint32_t* idx, size_t n, uint8_t* out);

}  // namespace cpu
}  // namespace sketchsgd::kernels
