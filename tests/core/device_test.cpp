// Device and Buffer: names, copies, moves, bounds, and a missing GPU as a typed error.
#include <gtest/gtest.h>

#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>

namespace sketchsgd {
namespace {

TEST(Device, ParsesNamesAndRejectsOthers) {
  EXPECT_FALSE(Device::parse("cpu").is_gpu());
  EXPECT_EQ(Device::parse("cuda").gpu, 0);
  EXPECT_EQ(Device::parse("cuda:3").gpu, 3);
  EXPECT_EQ(Device::parse("cuda:3").name(), "cuda:3");
  for (const char* bad : {"", "cuda:", "cuda:x", "cuda:-1", "tpu", "cuda:12345"})
    EXPECT_THROW(Device::parse(bad), InvalidArgument) << bad;
}

TEST(Device, BufferCopiesRefuseToOverflow) {
  Buffer<float> b(3, Device::cpu());
  const std::vector<float> four(4, 1.0f), two{5.0f, 6.0f};
  EXPECT_THROW(b.upload(four), InvalidArgument);
  b.upload(two);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{5.0f, 6.0f, 0.0f}));
  std::vector<float> out(4);
  EXPECT_THROW(b.download(out), InvalidArgument);
}

TEST(Device, BuffersCopyDeepAndMoveEmpty) {
  Buffer<float> a(2, Device::cpu());
  a.upload(std::vector<float>{1.0f, 2.0f});
  Buffer<float> b = a;
  b.upload(std::vector<float>{3.0f});
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{3.0f, 2.0f}));
  Buffer<float> c = std::move(b);
  EXPECT_EQ(c.to_vector(), (std::vector<float>{3.0f, 2.0f}));
  EXPECT_EQ(b.size(), 0u);  // NOLINT(bugprone-use-after-move): a moved-from buffer is empty
  EXPECT_TRUE(b.to_vector().empty());
}

TEST(Device, AMissingGpuIsATypedError) {
  // Asks for one more device than exists: in a build or on a machine without CUDA, that is cuda:0.
  const Device missing = Device::cuda(gpu::device_count());
  EXPECT_THROW(CountSketch(SketchConfig{1000, 3, 100, 1, Hashing::OnTheFly}, missing), CudaError);
  EXPECT_THROW(make_compressor("sketch:rows=1,cols=100,k=10", 1000, missing), CudaError);
}

TEST(Invariant, ABrokenInvariantAbortsWithWhereAndWhatNotAnException) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int queued = 3;
  EXPECT_DEATH(SKETCHSGD_ASSERT(queued == 4, "queued ", queued),
               "internal invariant broken at .*device_test.cpp:[0-9]+: queued == 4 queued 3");
  EXPECT_NO_FATAL_FAILURE(SKETCHSGD_ASSERT(queued == 3));
}

}  // namespace
}  // namespace sketchsgd
