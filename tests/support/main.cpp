// Test entry point. `--dump-hashes SEED ROWS COLS N` prints packed hashes and exits: the
// cross-process determinism test runs this binary as a separate process and compares.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sketchsgd/kernels/hash.hpp>

int main(int argc, char** argv) {
  if (argc == 6 && std::strcmp(argv[1], "--dump-hashes") == 0) {
    const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
    const uint32_t rows = uint32_t(std::strtoul(argv[3], nullptr, 10));
    const uint32_t cols = uint32_t(std::strtoul(argv[4], nullptr, 10));
    const uint32_t n = uint32_t(std::strtoul(argv[5], nullptr, 10));
    for (uint32_t r = 0; r < rows; ++r)
      for (uint32_t j = 0; j < n; ++j)
        std::printf("%u\n", sketchsgd::hash::locate(sketchsgd::hash::row_hash(seed, r), j, cols));
    return 0;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
