#include "idx.hpp"

#include <zlib.h>

#include <filesystem>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::demo {
namespace {

// The whole file, gunzipped when it is gzip (gzread passes plain files through unchanged).
std::vector<uint8_t> slurp(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw Error(path +
                " not found: install the Debian package dataset-fashion-mnist "
                "(apt-get install dataset-fashion-mnist) or pass --data DIR");
  gzFile f = gzopen(path.c_str(), "rb");
  SKETCHSGD_REQUIRE(f != nullptr, Error, "cannot open ", path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  // Bounded: no IDX file of this data set is larger than 64 MiB uncompressed.
  while ((n = gzread(f, buf, sizeof buf)) > 0 && out.size() <= (size_t(64) << 20))
    out.insert(out.end(), buf, buf + n);
  int err = Z_OK;
  const char* msg = n < 0 ? gzerror(f, &err) : nullptr;
  gzclose(f);
  SKETCHSGD_REQUIRE(n >= 0, WireError, path, ": corrupt compressed data (", msg ? msg : "?", ")");
  SKETCHSGD_REQUIRE(out.size() <= (size_t(64) << 20), WireError, path, ": larger than 64 MiB");
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 | b[at + 3];
}

}  // namespace

Images read_images(const std::string& path) {
  const auto b = slurp(path);
  SKETCHSGD_REQUIRE(b.size() >= 16, WireError, path, ": truncated header (", b.size(), " bytes)");
  SKETCHSGD_REQUIRE(be32(b, 0) == 0x00000803, WireError, path, ": magic ", be32(b, 0),
                    " is not an idx3-ubyte image file (2051)");
  Images im;
  im.count = be32(b, 4);
  im.rows = be32(b, 8);
  im.cols = be32(b, 12);
  SKETCHSGD_REQUIRE(im.rows >= 1 && im.rows <= 1024 && im.cols >= 1 && im.cols <= 1024, WireError,
                    path, ": image size ", im.rows, " x ", im.cols);
  const uint64_t need = uint64_t(im.count) * im.rows * im.cols;
  SKETCHSGD_REQUIRE(b.size() - 16 == need, WireError, path, ": header promises ", im.count,
                    " images (", need, " bytes), file holds ", b.size() - 16);
  im.pixels.assign(b.begin() + 16, b.end());
  return im;
}

std::vector<uint8_t> read_labels(const std::string& path, uint32_t classes) {
  const auto b = slurp(path);
  SKETCHSGD_REQUIRE(b.size() >= 8, WireError, path, ": truncated header (", b.size(), " bytes)");
  SKETCHSGD_REQUIRE(be32(b, 0) == 0x00000801, WireError, path, ": magic ", be32(b, 0),
                    " is not an idx1-ubyte label file (2049)");
  const uint32_t count = be32(b, 4);
  SKETCHSGD_REQUIRE(b.size() - 8 == count, WireError, path, ": header promises ", count,
                    " labels, file holds ", b.size() - 8);
  std::vector<uint8_t> y(b.begin() + 8, b.end());
  for (size_t i = 0; i < y.size(); ++i)
    SKETCHSGD_REQUIRE(y[i] < classes, WireError, path, ": label ", int(y[i]), " at ", i,
                      " is not below ", classes);
  return y;
}

Dataset load_fashion_mnist(const std::string& dir, const std::string& split, uint32_t limit) {
  SKETCHSGD_REQUIRE(split == "train" || split == "t10k", InvalidArgument,
                    "split must be train or t10k");
  const Images im = read_images(dir + "/" + split + "-images-idx3-ubyte.gz");
  const auto labels = read_labels(dir + "/" + split + "-labels-idx1-ubyte.gz");
  SKETCHSGD_REQUIRE(im.rows == 28 && im.cols == 28, WireError,
                    "Fashion-MNIST images are 28 x 28, got ", im.rows, " x ", im.cols);
  SKETCHSGD_REQUIRE(labels.size() == im.count, WireError, split, ": ", im.count, " images but ",
                    labels.size(), " labels");
  Dataset d;
  d.count = limit ? std::min(limit, im.count) : im.count;
  d.x.resize(size_t(d.count) * 784);
  for (size_t i = 0; i < d.x.size(); ++i) d.x[i] = (im.pixels[i] / 255.0f - 0.2860f) / 0.3530f;
  d.y.assign(labels.begin(), labels.begin() + d.count);
  return d;
}

}  // namespace sketchsgd::demo
