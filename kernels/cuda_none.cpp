// Build without CUDA: every kernel entry point says so with a typed error.
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cuda.hpp>

namespace sketchsgd::kernels::cuda {
namespace {
[[noreturn]] void absent() {
  throw CudaError("sketchsgd was built without CUDA (configure with -DSKETCHSGD_CUDA=ON)");
}
}  // namespace

void check_indices(const uint32_t*, size_t, uint64_t, unsigned long long*, Stream) {
  absent();
}

void precompute_hashes(const SketchLayout&, uint32_t*, Stream) {
  absent();
}
void precompute_windows(const SketchLayout&, uint32_t*, Stream) {
  absent();
}
void accumulate(const SketchLayout&, float*, const float*, size_t, uint64_t, float,
                unsigned long long*, Stream) {
  absent();
}
void estimate(const SketchLayout&, const float*, const uint32_t*, size_t, float*, Stream) {
  absent();
}
void estimate_all(const SketchLayout&, const float*, float*, Stream) {
  absent();
}
void estimate_topk(const SketchLayout&, const float*, size_t, uint32_t*, float*, Workspace&, Stream,
                   Order) {
  absent();
}
void zero_buckets(const SketchLayout&, float*, const uint32_t*, size_t, Stream) {
  absent();
}
void l2_estimate(const SketchLayout&, const float*, double*, Workspace&, Stream) {
  absent();
}
void topk(const float*, size_t, size_t, uint32_t*, float*, Workspace&, Stream, Order) {
  absent();
}
void find_nonfinite(const float*, size_t, unsigned long long*, Stream) {
  absent();
}
void axpy(float*, const float*, size_t, float, Stream) {
  absent();
}
void scale(float*, const float*, size_t, float, Stream) {
  absent();
}
void scale_pieces(std::span<const Piece>, float, Stream) {
  absent();
}
void momentum_accumulate(float*, float*, const float*, size_t, float, Stream) {
  absent();
}
void adagrad(float*, float*, const float*, size_t, float, float, Stream) {
  absent();
}
void adam(float*, float*, float*, const float*, size_t, float, float, float, float, float, float,
          Stream) {
  absent();
}
void chunk_stats(const float*, size_t, size_t, ChunkStats*, Stream) {
  absent();
}
void gather(const float*, const uint32_t*, size_t, float*, Stream) {
  absent();
}
void scatter(float*, const uint32_t*, const float*, size_t, Stream) {
  absent();
}
void zero_at(float*, const uint32_t*, size_t, Stream) {
  absent();
}
void scatter_axpy(float*, const uint32_t*, const float*, size_t, float, Stream) {
  absent();
}
void pack_signs(const float*, size_t, uint32_t*, Stream) {
  absent();
}
void unpack_signs(const uint32_t*, size_t, size_t, const float*, float*, bool, Stream) {
  absent();
}
void count_negative(const uint32_t*, size_t, uint32_t*, Stream) {
  absent();
}
void ternarize(const float*, size_t, size_t, const float*, uint64_t, uint64_t, uint8_t*, Stream) {
  absent();
}
size_t delta_encode(const uint32_t*, size_t, uint8_t*, Workspace&, Stream) {
  absent();
}
void pack_ternary(const float*, size_t, uint8_t*, Stream) {
  absent();
}
void unpack_ternary(const uint8_t*, size_t, size_t, const float*, float, float*, bool,
                    unsigned long long*, Stream) {
  absent();
}

void round_half(float*, size_t, bool, unsigned long long*, Stream) {
  absent();
}
void gemm(bool, bool, size_t, size_t, size_t, float, const float*, size_t, const float*, size_t,
          float, float*, size_t, Stream) {
  absent();
}
void orthonormalize(float*, std::span<const Factor>, const Factor*, float*, Workspace&, Stream) {
  absent();
}

}  // namespace sketchsgd::kernels::cuda
