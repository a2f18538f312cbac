#include <sketchsgd/kernels/sample.hpp>

#include <algorithm>
#include <unordered_set>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/hash.hpp>

namespace sketchsgd {
namespace {

/// A counter-based stream of 64-bit words: SplitMix64 of (key + n · golden ratio).
class Words {
 public:
  explicit Words(uint64_t key) : key_(key) {}
  uint64_t next() { return hash::splitmix64(key_ + 0x9E3779B97F4A7C15ull * ++n_); }
  /// Uniform in [0, range), 1 ≤ range ≤ 2^32, without modulo bias (Lemire 2019: the high half
  /// of a 32-bit word times the range, the short tail rejected).
  uint32_t below(uint64_t range) {
    constexpr uint64_t low = 0xFFFFFFFFull;
    uint64_t m = (next() >> 32) * range;
    if ((m & low) < range) {
      const uint64_t floor = ((low + 1) - range) % range;
      while ((m & low) < floor) m = (next() >> 32) * range;
    }
    return uint32_t(m >> 32);
  }

 private:
  uint64_t key_, n_ = 0;
};

}  // namespace

std::vector<uint32_t> sample_clients(uint32_t population, uint32_t per_round, uint64_t seed,
                                     uint64_t round) {
  SKETCHSGD_REQUIRE(per_round >= 1 && per_round <= population, InvalidArgument, "sampling ",
                    per_round, " clients of ", population,
                    ": expected 1 ≤ clients per round ≤ population");
  Words words(hash::splitmix64(seed) ^ hash::splitmix64(round ^ 0xD1B54A32D192ED03ull));
  // Floyd: for j = N − C … N − 1 take a uniform t ≤ j, or j itself when t is taken already;
  // every C-subset comes out with probability 1 / (N choose C).
  std::unordered_set<uint32_t> taken;
  taken.reserve(per_round * 2);
  std::vector<uint32_t> out;
  out.reserve(per_round);
  for (uint64_t j = uint64_t(population) - per_round; j < population; ++j) {
    const uint32_t t = words.below(j + 1);
    const uint32_t pick = taken.insert(t).second ? t : uint32_t(j);
    if (pick != t) taken.insert(pick);
    out.push_back(pick);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sketchsgd
