// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed, read with every field
// checked: magic, dimension count, sizes against the bytes present, label range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sketchsgd::demo {

struct Images {
  uint32_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  ///< count × rows × cols, row-major
};

/// Reads an idx3-ubyte file (magic 0x00000803). Throws sketchsgd::Error: a missing file names the
/// Debian package to install; a truncated or malformed one says what is wrong.
Images read_images(const std::string& path);
/// Reads an idx1-ubyte file (magic 0x00000801) whose labels must be < classes.
std::vector<uint8_t> read_labels(const std::string& path, uint32_t classes = 10);

struct Dataset {
  std::vector<float> x;  ///< count × 784, scaled to [0, 1] then normalised (mean 0.2860, sd 0.3530)
  std::vector<int64_t> y;
  uint32_t count = 0;
};

/// Fashion-MNIST from Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist):
/// split "train" (60,000) or "t10k" (10,000). limit > 0 keeps the first `limit` examples.
Dataset load_fashion_mnist(const std::string& dir, const std::string& split, uint32_t limit = 0);

inline constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

}  // namespace sketchsgd::demo
