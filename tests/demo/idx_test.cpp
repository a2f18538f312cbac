// The demo's IDX reader: valid files (plain and gzip), truncated, wrong magic, bad labels, a
// missing file naming the package to install, and the real data set when it is installed.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include <sketchsgd/core/error.hpp>
#include "demo/idx.hpp"

namespace sketchsgd::demo {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> be(std::initializer_list<uint32_t> words) {
  std::vector<uint8_t> b;
  for (uint32_t w : words)
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(w >> s));
  return b;
}

fs::path write(const std::string& name, const std::vector<uint8_t>& bytes, bool gz) {
  const fs::path p =
      fs::temp_directory_path() / ("sketchsgd-idx-" + std::to_string(getpid()) + "-" + name);
  if (gz) {
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  return p;
}

std::vector<uint8_t> image_file(uint32_t n, uint32_t r, uint32_t c) {
  auto b = be({0x803, n, r, c});
  for (uint32_t i = 0; i < n * r * c; ++i) b.push_back(uint8_t(i * 7));
  return b;
}

TEST(Idx, ReadsPlainAndGzipImagesAndLabels) {
  for (bool gz : {false, true}) {
    const Images im = read_images(write("img", image_file(3, 4, 5), gz));
    EXPECT_EQ(im.count, 3u);
    EXPECT_EQ(im.rows, 4u);
    EXPECT_EQ(im.cols, 5u);
    ASSERT_EQ(im.pixels.size(), 60u);
    EXPECT_EQ(im.pixels[59], uint8_t(59 * 7));
    auto lb = be({0x801, 4});
    lb.insert(lb.end(), {0, 9, 3, 1});
    EXPECT_EQ(read_labels(write("lbl", lb, gz)), (std::vector<uint8_t>{0, 9, 3, 1}));
  }
}

TEST(Idx, RejectsTruncatedWrongMagicAndBadLabels) {
  auto img = image_file(3, 4, 5);
  img.pop_back();
  EXPECT_THROW(read_images(write("t1", img, true)), WireError);
  EXPECT_THROW(read_images(write("t2", {0, 0, 8}, false)), WireError);
  auto wrong = image_file(1, 2, 2);
  wrong[3] = 0x01;  // a label file's magic
  EXPECT_THROW(read_images(write("t3", wrong, false)), WireError);
  EXPECT_THROW(read_images(write("t4", be({0x803, 1, 0, 5}), false)), WireError);
  EXPECT_THROW(read_images(write("t5", be({0x803, 0xFFFFFFFF, 1024, 1024}), false)), WireError);
  auto lb = be({0x801, 2});
  lb.insert(lb.end(), {1, 10});
  EXPECT_THROW(read_labels(write("t6", lb, false)), WireError);
  lb.pop_back();
  EXPECT_THROW(read_labels(write("t7", lb, false)), WireError);
  // A gzip stream cut in the middle.
  const fs::path gz = write("t8", image_file(50, 28, 28), true);
  fs::resize_file(gz, fs::file_size(gz) / 2);
  EXPECT_THROW(read_images(gz.string()), WireError);
  try {
    read_images("/nonexistent/train-images-idx3-ubyte.gz");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset-fashion-mnist"), std::string::npos);
  }
}

TEST(Idx, LoadsTheInstalledFashionMnist) {
  if (!fs::exists(std::string(kFashionDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const Dataset d = load_fashion_mnist(kFashionDir, "t10k");
  EXPECT_EQ(d.count, 10000u);
  EXPECT_EQ(d.x.size(), 10000u * 784);
  std::vector<int> per_class(10);
  for (auto y : d.y) ++per_class[size_t(y)];
  for (int c : per_class) EXPECT_EQ(c, 1000);  // the test split is balanced
  EXPECT_EQ(load_fashion_mnist(kFashionDir, "t10k", 50).count, 50u);
  EXPECT_THROW(load_fashion_mnist(kFashionDir, "validation"), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::demo
