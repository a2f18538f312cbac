// CUDA backend entry points: the same kernels as cpu.hpp, on device memory, asynchronous on the
// caller's stream. Declared in every build; without CUDA every entry point throws CudaError
// (SKETCHSGD_HAS_CUDA in <sketchsgd/config.hpp> says which build).
//
// Pointers are device memory unless a comment says otherwise. Callers validate sizes; kernels
// trust them. Launch and CUDA-call failures throw CudaError with the CUDA error text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <sketchsgd/core/gpu.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::kernels::cuda {

using Stream = gpu::Stream;
using Workspace = gpu::Workspace;

/// *first (device, preset to UINT64_MAX) = min position i with idx[i] ≥ limit.
void check_indices(const uint32_t* idx, size_t n, uint64_t limit, unsigned long long* first,
                   Stream stream = nullptr);

// ---- count sketch -------------------------------------------------------------------------------
/// packed[row · dim + j], bit-identical to cpu::precompute_hashes.
void precompute_hashes(const SketchLayout& s, uint32_t* packed, Stream stream = nullptr);
/// The window words of blocked hashing, bit-identical to cpu::precompute_windows.
void precompute_windows(const SketchLayout& s, uint32_t* words, Stream stream = nullptr);

/// table += scale · S(x) for coordinates offset … offset + n − 1 (atomic adds: the summation order
/// differs from the CPU's, so results agree to float rounding). Non-finite values are skipped and
/// the smallest such coordinate (relative to x) is atomically min-ed into *first_bad (device
/// memory; the caller sets it to UINT64_MAX first), so one pass both adds and validates.
void accumulate(const SketchLayout& s, float* table, const float* x, size_t n, uint64_t offset,
                float scale, unsigned long long* first_bad, Stream stream = nullptr);

/// out[i] = median over rows of sign · table[bucket] for coordinate idx[i].
void estimate(const SketchLayout& s, const float* table, const uint32_t* idx, size_t n, float* out,
              Stream stream = nullptr);
/// out[j] for every coordinate j < dim.
void estimate_all(const SketchLayout& s, const float* table, float* out, Stream stream = nullptr);
/// The k coordinates of largest estimated magnitude, ordered as cpu::estimate_topk (|value|
/// descending, index ascending) or by index: a radix select on the estimates computed on the fly,
/// never an r × d or d-sized intermediate. Synchronises on the stream to read back candidate
/// counts.
void estimate_topk(const SketchLayout& s, const float* table, size_t k, uint32_t* idx, float* val,
                   Workspace& ws, Stream stream = nullptr, Order order = Order::Magnitude);
/// Zeroes in every row the bucket each of the n coordinates idx hashes to.
void zero_buckets(const SketchLayout& s, float* table, const uint32_t* idx, size_t n,
                  Stream stream = nullptr);
/// *out (device double) = sqrt(median over rows of Σ_col table[row][col]²).
void l2_estimate(const SketchLayout& s, const float* table, double* out, Workspace& ws,
                 Stream stream = nullptr);

// ---- selection ----------------------------------------------------------------------------------
/// The k largest |x[j]|, ordered as cpu::topk. Radix select, 11 bits per pass, candidates
/// compacted between passes; reads x about twice. Synchronises on the stream (candidate counts).
void topk(const float* x, size_t n, size_t k, uint32_t* idx, float* val, Workspace& ws,
          Stream stream = nullptr, Order order = Order::Magnitude);

// ---- dense matrices (row-major, as cpu::gemm; cuBLAS) -----------------------------------------
void gemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha, const float* a,
          size_t lda, const float* b, size_t ldb, float beta, float* c, size_t ldc,
          Stream stream = nullptr);
/// cpu::orthonormalize of every factor of base (the list on the host and in device memory), to
/// rounding: CholeskyQR2 over all of them at once (seven launches), Gram-Schmidt for a factor
/// with a tiny pivot or a rank past 64; Gram-Schmidt for all (one launch) when no rank exceeds 8
/// or rr (device) asks for each one's R at its r_at.
void orthonormalize(float* base, std::span<const Factor> host, const Factor* factors, float* rr,
                    Workspace& ws, Stream stream = nullptr);

// ---- dense vectors ------------------------------------------------------------------------------
/// *first = min(*first, index of the first NaN/±Inf in x); the caller sets *first to UINT64_MAX.
void find_nonfinite(const float* x, size_t n, unsigned long long* first, Stream stream = nullptr);
void axpy(float* y, const float* x, size_t n, float a, Stream stream = nullptr);
/// x rounded in place to fp16 (bf16 = false) or bf16 values, as the wire carries them; the
/// first value that became ±Inf (or was not finite) min-ed into *first.
void round_half(float* x, size_t n, bool bf16, unsigned long long* first, Stream stream = nullptr);
/// y = a · x (y may be x)
void scale(float* y, const float* x, size_t n, float a, Stream stream = nullptr);
/// Pieces one launch takes (their list travels as a kernel parameter: no upload).
inline constexpr size_t kMaxPieces = 16;
/// dst = a · src for up to kMaxPieces pieces in one launch; a = 1 copies bit for bit.
void scale_pieces(std::span<const Piece> pieces, float a, Stream stream = nullptr);
/// u = ρ·u + g; v += u, in one pass (the fused momentum + error-feedback update).
void momentum_accumulate(float* u, float* v, const float* g, size_t n, float rho,
                         Stream stream = nullptr);
/// elem::adagrad at every coordinate.
void adagrad(float* w, float* v, const float* s, size_t n, float lr, float eps,
             Stream stream = nullptr);
/// elem::adam at every coordinate.
void adam(float* w, float* m, float* v, const float* s, size_t n, float lr, float b1, float b2,
          float c1, float c2, float eps, Stream stream = nullptr);
/// Per-chunk |max|, mean |x| and standard deviation (double accumulation, as the CPU).
void chunk_stats(const float* x, size_t n, size_t chunk, ChunkStats* out, Stream stream = nullptr);

// ---- sparse vectors -----------------------------------------------------------------------------
void gather(const float* x, const uint32_t* idx, size_t n, float* out, Stream stream = nullptr);
void scatter(float* y, const uint32_t* idx, const float* val, size_t n, Stream stream = nullptr);
void zero_at(float* y, const uint32_t* idx, size_t n, Stream stream = nullptr);
/// y[idx[i]] += a · val[i] (indices distinct).
void scatter_axpy(float* y, const uint32_t* idx, const float* val, size_t n, float a,
                  Stream stream = nullptr);

// ---- bit packing (formats identical to cpu.hpp's) -----------------------------------------------
void pack_signs(const float* x, size_t n, uint32_t* words, Stream stream = nullptr);
void unpack_signs(const uint32_t* words, size_t n, size_t chunk, const float* scales, float* out,
                  bool accumulate, Stream stream = nullptr);
void count_negative(const uint32_t* words, size_t n, uint32_t* neg, Stream stream = nullptr);
void ternarize(const float* x, size_t n, size_t chunk, const float* scales, uint64_t seed,
               uint64_t stream_id, uint8_t* codes, Stream stream = nullptr);
void pack_ternary(const float* x, size_t n, uint8_t* codes, Stream stream = nullptr);
/// cpu::delta_encode of n strictly increasing indices into out (room for 5 · n bytes): a length
/// per index, a scan, then every varint written at its offset. Returns the bytes written
/// (synchronises on the stream to read it).
size_t delta_encode(const uint32_t* idx, size_t n, uint8_t* out, Workspace& ws,
                    Stream stream = nullptr);
/// Writes nothing when any code is invalid; *first_bad (device, preset to UINT64_MAX) receives
/// the first invalid position. Validation and decoding are two launches on the stream.
void unpack_ternary(const uint8_t* codes, size_t n, size_t chunk, const float* scales, float weight,
                    float* out, bool accumulate, unsigned long long* first_bad,
                    Stream stream = nullptr);

}  // namespace sketchsgd::kernels::cuda
