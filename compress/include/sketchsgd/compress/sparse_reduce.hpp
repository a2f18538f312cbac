// A sparse all-reduce of W ranks' sparse lists (Ok-Topk: Li & Hoefler, PPoPP 2022), for gathered
// codecs whose messages are such lists (topk, sparseloco). The index space is cut into W ranges,
// one owned by each rank. Each rank sends each owner its pairs in that owner's range (an
// all-to-all); the owner sums what it receives (SparseSum, so at each index the all-gather's mean
// bit for bit); the counts of every owner's sums by magnitude, summed (two all-reduces of
// kBuckets counts: by bucket, then by fine sub-bucket within the bucket where the budget ends),
// give every rank the same cut; each owner keeps its sums above it and those are gathered. Every
// rank then holds the same update of at most `budget` values (see cut()): the all-gather's
// update itself when its union fits the budget, else its largest values to 2^-10 of their
// magnitude, whatever the ranges. Each rank's pairs the update lacks go back to its error
// feedback (dropped()).
//
// A rank's link carries its pairs out and its range's in (about k (W − 1) / W each where the
// ranges balance), the counts, and the kept values (about budget (W − 1) / W): against
// (W − 1) · k for an all-gather of every rank's list, which grows with W where this does not.
// balance() moves the ranges so that each receives an even share of the pairs, by where the
// last step's pairs lay (Ok-Topk's boundaries; each owner's Profile, 16 bytes, travels with its
// kept values): gradients' large values cluster (a layer, an embedding's rows), and an owner of
// many would receive and gather for all.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/core/bytes.hpp>
#include <sketchsgd/core/hd.hpp>

namespace sketchsgd {

/// A sparse vector: indices strictly increasing, a value at each.
struct SparseList {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

namespace sparse {

using Sparse = SparseList;

/// A value's place in the selection, by its magnitude's bits past the sign read in two parts:
/// its bucket (the exponent and the mantissa's top bit: buckets a factor √2 apart) and, within
/// it, its fine sub-bucket (the next 9 bits). Either pass all-reduces kBuckets counts (2 KB).
constexpr uint32_t kBuckets = 512;

/// |v|'s bucket: increasing with |v| (0 for zeros and the smallest subnormals).
inline uint32_t bucket(float v) {
  return (float_bits(v) & 0x7fffffffu) >> 22;
}
/// |v|'s fine sub-bucket within its bucket, increasing with |v|.
inline uint32_t fine(float v) {
  return (float_bits(v) >> 13) & (kBuckets - 1);
}

/// Where the kept values end: those whose (bucket, fine) is at least (bucket, fine).
struct Cut {
  uint32_t bucket = 0, fine = 0;
};

/// W ranges cutting [0, dim): rank r owns [begin(r), end(r)), possibly empty.
class Ranges {
 public:
  /// Even ranges (InvalidArgument for world 0 or dim past 2^32).
  Ranges(uint64_t dim, uint32_t world);

  /// Where an owner's received pairs lay: how many, and the indices at their quartiles.
  struct Profile {
    uint32_t count = 0;
    uint32_t quartiles[3] = {};
  };
  /// This range's Profile from the parts every rank sent its owner (each strictly increasing,
  /// within the range): the pairs' indices with their multiplicity.
  Profile profile(std::span<const Sparse> parts) const;
  /// Boundaries that cut the pairs every owner received (profiles: one per range, in rank
  /// order, as profile() made them) into W shares of about equal count, their distribution
  /// taken as linear between a range's ends and quartiles; unchanged when there were none.
  void balance(std::span<const Profile> profiles);

  uint32_t world() const { return uint32_t(bounds_.size() - 1); }
  uint64_t dim() const { return bounds_.back(); }
  uint64_t begin(uint32_t r) const { return bounds_[r]; }
  uint64_t end(uint32_t r) const { return bounds_[r + 1]; }
  /// The rank that owns an index (< dim).
  uint32_t owner(uint32_t index) const;

 private:
  std::vector<uint64_t> bounds_;  // W + 1 of them: 0, …, dim
};

/// A rank's list (indices strictly increasing, < dim) split by owner: parts[r] its pairs in
/// range r.
std::vector<Sparse> split(const Sparse& mine, const Ranges& ranges);

/// An owner's range of the mean over `world` ranks: the sum of the parts every rank sent it
/// (each strictly increasing) divided by float32(world), as SparseSum sums, so equal at every
/// index to the all-gather's mean.
Sparse mean(std::span<const Sparse> parts, uint32_t world);

/// Adds a list's values, bucket by bucket, to counts (kBuckets of them).
void count(const Sparse& s, std::span<float> counts);

/// The first pass, from the buckets' counts summed over every owner: the bucket the budget ends
/// in (the values above it fit, with it they do not), or kBuckets when every value fits.
uint32_t split(std::span<const float> counts, uint64_t budget);

/// Adds the fine sub-buckets' counts of a list's values in bucket b to counts (kBuckets).
void count_fine(const Sparse& s, uint32_t b, std::span<float> counts);

/// The second pass, from both passes' counts (summed) and split()'s bucket b: the Cut keeping
/// the most values within budget, every value above b and b's at its largest fine sub-buckets
/// that fit; all of them where b is kBuckets. Where that would keep nothing at all (b the top
/// bucket, its top sub-bucket alone past the budget) that sub-bucket is kept whole, past the
/// budget: an update is never empty while there is something to send.
Cut cut(std::span<const float> counts, std::span<const float> fine_counts, uint32_t b,
        uint64_t budget);

/// s's pairs the cut keeps.
Sparse keep(const Sparse& s, Cut c);

/// mine's pairs at indices the update (strictly increasing) does not hold: what the global
/// selection took from this rank, for its error feedback to keep.
Sparse dropped(const Sparse& mine, std::span<const uint32_t> update);

/// A list as it travels between ranks: its count, indices (u32, or delta-coded: about a byte
/// each at 1 % density), values in a wire format (a value beyond a 16-bit format's range:
/// NonFiniteError, before anything is written).
Bytes to_bytes(const Sparse& s, bool delta, WireFloat values);
/// Reads one back: WireError where the bytes are not a list of at most max_count values, its
/// indices strictly increasing and below dim, its values finite.
Sparse from_bytes(std::span<const uint8_t> bytes, uint64_t dim, uint64_t max_count, bool delta,
                  WireFloat values);

/// Concatenates lists that follow each other in index order (the owners' kept values in rank
/// order) into one strictly increasing list.
Sparse join(std::span<const Sparse> lists);

}  // namespace sparse
}  // namespace sketchsgd
