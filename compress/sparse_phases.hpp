// A Round's phases under reduce=sparse (compress/round.hpp): the sparse all-reduce of
// compress/sparse_reduce.hpp as collectives whose checks every rank makes alike.
//
//   0  Gather(the length of this rank's longest part; 0: its input was not finite)
//   1  Exchange(its parts, each padded to the longest of any rank: an all-to-all of equal parts)
//   2  Sum(the tensors sent whole ++ this owner's counts by bucket; NaN where a part it received
//      did not decode, so that every rank learns of it)
//   3  Sum(its counts by fine sub-bucket within the bucket where the budget ends)
//   4  Gather(the length of this owner's kept values and Profile)
//   5  Gather(them, padded to the longest)
//   finish: the update from every owner's kept values, the same on every rank
//
// Lengths go through all-gathers so that every rank checks the same numbers and raises alike;
// the parts' padding (to the longest, where the ranges balance a few percent) buys that.
#pragma once

#include <cstdint>
#include <exception>
#include <span>
#include <vector>

#include <sketchsgd/compress/sparse_reduce.hpp>
#include "sparse_codec.hpp"

namespace sketchsgd {

class SparsePhases {
 public:
  SparsePhases(SparseListCodec& codec, uint64_t dim, uint32_t world, uint32_t rank);

  /// Phase 0, from this rank's message (empty: its input failed): its parts, and the bytes of the
  /// length to gather (valid until the next call).
  std::span<const uint8_t> start(std::span<const uint8_t> message);
  /// Phase 1, from every rank's length: this rank's parts padded to the longest, in rank order.
  /// NonFiniteError where a rank failed, WireError for a length past any list's.
  std::vector<std::span<const uint8_t>> parts(std::span<const std::span<const uint8_t>> lengths);
  /// Phase 2, from the parts every rank sent this owner (rank order): this range's mean, and
  /// its magnitude counts in counts (kBuckets values, host) — all NaN where a part does not
  /// decode (the fault held until counted(), where this rank raises it).
  void receive(std::span<const std::span<const uint8_t>> received, std::span<float> counts);
  /// Phase 3, from the counts summed over every rank: this owner's counts by fine sub-bucket in
  /// fine_counts (kBuckets, host). Raises this rank's fault, or WireError where another's (NaN).
  void counted(std::span<const float> counts, std::span<float> fine_counts);
  /// Phase 4, from the fine counts summed: this owner's kept values, and the bytes of their
  /// length to gather.
  std::span<const uint8_t> refined(std::span<const float> fine_counts);
  /// Phase 5, from every owner's length: its kept values padded to the longest.
  std::span<const uint8_t> padded(std::span<const std::span<const uint8_t>> lengths);
  /// Finish, from every owner's padded kept values: the update's list (strictly increasing),
  /// and the owners' profiles held for settle(). WireError where an owner's values do not
  /// decode or lie outside its range.
  payload::Sparse update(std::span<const std::span<const uint8_t>> gathered);
  /// Once the update is applied: error feedback takes back this rank's pairs it lacks, and the
  /// ranges follow where this step's pairs lay.
  void settle(const payload::Sparse& update);
  /// How lists travel, the update's included.
  payload::SparseFormat format() const { return format_; }

 private:
  /// Reads W 8-byte little-endian lengths, each at most limit.
  std::vector<uint64_t> lengths_of(std::span<const std::span<const uint8_t>> lengths,
                                   uint64_t limit, const char* what) const;
  void put_length(uint64_t n);

  SparseListCodec& codec_;
  payload::SparseFormat format_;
  uint64_t dim_;
  uint32_t world_, rank_;
  sparse::Ranges ranges_;
  payload::Sparse mine_;                   // this rank's list
  std::vector<std::vector<uint8_t>> out_;  // its parts, padded
  payload::Sparse mean_;                   // this owner's range of the mean
  sparse::Ranges::Profile profile_;        // where the pairs it received lay
  std::vector<float> counts_;              // the first pass's counts, summed
  uint32_t split_ = 0;                     // the bucket the budget ends in
  std::vector<uint8_t> kept_;              // its kept values and profile, padded
  uint64_t part_limit_, kept_limit_;
  std::vector<uint64_t> kept_sizes_;               // every owner's kept bytes
  std::vector<sparse::Ranges::Profile> profiles_;  // every owner's, from the gathered bytes
  std::exception_ptr fault_;                       // a part this owner received did not decode
  uint8_t length_[8] = {};
};

}  // namespace sketchsgd
