// CountSketch created on the GPU: the same sketch as on the CPU, across serialisation, copies and
// streams; bad input refused without changing the table; the caller's device left current.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/hash.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "support/cuda.hpp"
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

TEST(CudaSketch, SameSketchOnEveryDeviceAndAcrossSerialisation) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (Hashing hashing : {Hashing::OnTheFly, Hashing::Precomputed, Hashing::Blocked}) {
    SketchConfig c{400009, 5, 40009, seed, hashing};
    auto x = test::gaussian(c.dim, seed, 0.01f);
    test::plant(x, 300, 3.0f, seed + 1);
    CountSketch cpu(c), gpu(c, Device::cuda());
    Dev<float> dx(x);
    cpu.accumulate(x);
    gpu.accumulate(cspan(dx, x.size()));
    EXPECT_EQ(gpu.device().gpu, 0);
    const CountSketch back = gpu.to(Device::cpu());
    for (size_t i = 0; i < cpu.table().size(); ++i)
      ASSERT_NEAR(back.table()[i], cpu.table()[i], 1e-4) << i;
    // Bytes from the GPU deserialise on the CPU (and back) to the same table.
    const auto bytes = gpu.serialize();
    const CountSketch on_cpu = CountSketch::deserialize(bytes);
    EXPECT_EQ(on_cpu.serialize(), bytes);
    const CountSketch on_gpu = CountSketch::deserialize(cpu.serialize(), Device::cuda());
    EXPECT_EQ(on_gpu.serialize(), cpu.serialize());
    // The same table gives the same heavy hitters and estimates, exactly.
    const TopK a = cpu.top_k(1000), b = on_gpu.top_k(1000);
    EXPECT_EQ(a.indices, b.indices);
    EXPECT_BITS_EQ(a.values, b.values);
    Dev<uint32_t> di(a.indices);
    EXPECT_BITS_EQ(on_gpu.estimate(cspan(di, a.indices.size())), cpu.estimate(a.indices));
    EXPECT_NEAR(on_gpu.l2_estimate(), cpu.l2_estimate(), 1e-6 * cpu.l2_estimate());
  }
}

// FetchSGD's selection on the device: the same set as on the CPU (by magnitude there, in index
// order here) and the same tables after the reset.
TEST(CudaSketch, ExtractTopKMatchesTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  SketchConfig c{200003, 1, 30011, seed, Hashing::Blocked};
  auto x = test::gaussian(c.dim, seed, 0.01f);
  test::plant(x, 200, 3.0f, seed + 1);
  CountSketch cpu(c), cpu_m(c);
  cpu.accumulate(x);
  cpu_m.accumulate(test::gaussian(c.dim, seed + 2));
  CountSketch gpu = cpu.to(Device::cuda()), gpu_m = cpu_m.to(Device::cuda());
  CountSketch* cpu_also[] = {&cpu_m};
  CountSketch* gpu_also[] = {&gpu_m};
  const TopK a = cpu.extract_top_k(500, cpu_also);
  const TopK b = gpu.extract_top_k(500, gpu_also);  // index order on both
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_BITS_EQ(a.values, b.values);
  EXPECT_EQ(gpu.to(Device::cpu()).serialize(), cpu.serialize());
  EXPECT_EQ(gpu_m.to(Device::cpu()).serialize(), cpu_m.serialize());
}

TEST(CudaSketch, RejectsBadInputWithoutChangingTheTable) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  SketchConfig c{100000, 3, 5003, seed, Hashing::OnTheFly};
  CountSketch gpu(c, Device::cuda());
  auto x = test::gaussian(c.dim, seed);
  x[4321] = std::nanf("");
  Dev<float> dx(x);
  try {
    gpu.accumulate(cspan(dx, x.size()));
    FAIL() << "no error for a NaN";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("4321"), std::string::npos) << e.what();
  }
  const CountSketch rolled_back = gpu.to(Device::cpu());
  for (float v : rolled_back.table()) ASSERT_EQ(v, 0.0f);  // it was empty: exactly zero again
  x[4321] = 1.0f;
  Dev<float> good(x);
  gpu.accumulate(cspan(good, x.size()));
  const auto before = gpu.to(Device::cpu());
  EXPECT_THROW(gpu.accumulate(cspan(dx, x.size())), NonFiniteError);
  const auto after = gpu.to(Device::cpu());
  for (size_t i = 0; i < before.table().size(); ++i)
    ASSERT_NEAR(after.table()[i], before.table()[i], 1e-5 * (1.0f + std::fabs(before.table()[i])))
        << i;

  Dev<uint32_t> bad(std::vector<uint32_t>{1, 2, uint32_t(c.dim)});
  EXPECT_THROW(gpu.zero_buckets(cspan(bad, 3)), InvalidArgument);
  Dev<float> out(3);
  EXPECT_THROW(gpu.estimate(cspan(bad, 3), std::span<float>(out.get(), 3)), InvalidArgument);
  CountSketch cpu(c);
  EXPECT_THROW(gpu += cpu, InvalidArgument);  // different devices: use to()
  // Host memory handed to a GPU object is an error, not a kernel fault.
  EXPECT_THROW(gpu.accumulate(x), InvalidArgument);
  std::vector<float> host_out(3);
  Dev<uint32_t> good_idx(std::vector<uint32_t>{1, 2, 3});
  EXPECT_THROW(gpu.estimate(cspan(good_idx, 3), host_out), InvalidArgument);
  auto codec = make_compressor("topk:k=10", c.dim, Device::cuda());
  EXPECT_THROW(codec->encode(x, 0, 0), InvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the context is still clean
  EXPECT_THROW(CountSketch(c, Device::cuda(gpu::device_count())), CudaError);
}

TEST(CudaSketch, CopiesAreIndependentAndStreamsAreOrdered) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  SketchConfig c{200003, 3, 20011, seed, Hashing::OnTheFly};
  const auto x = test::gaussian(c.dim, seed);
  Dev<float> dx(x);
  CountSketch a(c, Device::cuda());
  a.accumulate(cspan(dx, x.size()));
  CountSketch b = a;  // a deep copy: accumulating into b leaves a alone
  b.accumulate(cspan(dx, x.size()));
  const auto ta = a.to(Device::cpu()), tb = b.to(Device::cpu());
  for (size_t i = 0; i < ta.table().size(); ++i)
    ASSERT_NEAR(tb.table()[i], 2.0f * ta.table()[i], 1e-4f * (1.0f + std::fabs(ta.table()[i])));

  // A sketch copied onto a non-blocking stream keeps its table (the new table's zeroing is not
  // left queued behind the copy), and a merge from another stream waits for that stream.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  {
    CountSketch cpu(c);
    cpu.accumulate(x);
    const CountSketch on_s = cpu.to(Device::cuda(0, s));
    EXPECT_EQ(on_s.serialize(), cpu.serialize());
    CountSketch sum(c, Device::cuda());
    sum += on_s;
    sum += on_s;
    const auto back = sum.to(Device::cpu());
    for (size_t i = 0; i < back.table().size(); ++i)
      ASSERT_EQ(back.table()[i], 2.0f * cpu.table()[i]) << i;
  }
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);

  // Page-locked host memory is usable by the kernels; plain host memory is refused.
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, x.size() * sizeof(float)), cudaSuccess);
  std::copy(x.begin(), x.end(), pinned);
  CountSketch p(c, Device::cuda());
  p.accumulate(std::span<const float>(pinned, x.size()));
  const auto tp = p.to(Device::cpu());
  for (size_t i = 0; i < ta.table().size(); ++i)
    ASSERT_NEAR(tp.table()[i], ta.table()[i], 1e-4f * (1.0f + std::fabs(ta.table()[i]))) << i;
  cudaFreeHost(pinned);
}

TEST(CudaMultiGpu, CallsLeaveTheCallersDeviceCurrent) {
  REQUIRE_GPU();
  if (gpu::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  SketchConfig c{10007, 3, 1009, 7, Hashing::OnTheFly};
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  CountSketch on0(c, Device::cuda(0));
  (void)on0.top_k(10);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1);
  // Memory of another GPU is refused up front instead of faulting in a kernel.
  Dev<float> on1(std::vector<float>(c.dim, 1.0f));
  EXPECT_THROW(on0.accumulate(cspan(on1, c.dim)), InvalidArgument);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

}  // namespace
}  // namespace sketchsgd
