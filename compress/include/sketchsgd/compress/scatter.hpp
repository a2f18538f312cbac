// A gathered codec's reduce-scatter, per destination (FSDP's reduce-scatter and FSDP1's hook):
// a group's gradient is cut into W chunks, chunk r what rank r keeps, and each chunk is a unit
// with a Round of its own (its codec, its error feedback). A rank's message for chunk r then
// concerns rank r alone: it goes there, not to every rank, and each rank decodes the W messages
// of its own chunk — about W times fewer bytes over a rank's links than an all-gather of
// whole-gradient messages, and W times fewer decodes.
//
// The driver runs every round's start(), then
//   lengths() → this rank's W lengths, all-gathered by the driver into a W × W table;
//   next(table) → what to send to each rank and what to receive from each (one all-to-all);
//   the round of this rank's chunk: finish(the W received messages, ...).
// The chunks' tensors sent whole (their Sums) stay the driver's, one reduce-scatter or
// all-to-all (they are not messages).
//
// The lengths are what makes a failure every rank's at the same point: a rank whose chunk was not
// finite (any chunk) sends 0 for all, and next() raises on every rank once the table is in —
// before any message moves, so no rank is left waiting in the all-to-all. The failed rank raises
// its own error (with the coordinate), every other NonFiniteError naming it; a length over its
// chunk's message limit is a WireError on every rank alike.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <sketchsgd/compress/round.hpp>

namespace sketchsgd {

class Scatter {
 public:
  /// What next() asks the driver to exchange: send[r], this rank's bytes for rank r (empty where
  /// chunk r is whole tensors alone; valid until the rounds' next start()); receive[i], the bytes
  /// rank i sends here.
  struct Exchange {
    std::vector<std::span<const uint8_t>> send;
    std::vector<uint64_t> receive;
  };

  /// rounds[r]: chunk r's round on this rank, in a group of W = rounds.size() ranks; each a
  /// gathered codec's or a unit of whole tensors alone (a summable codec keeps the whole-gradient
  /// round: its sums need no per-rank decode). The rounds outlive the scatter.
  Scatter(std::vector<Round*> rounds, uint32_t rank);

  uint32_t world() const { return static_cast<uint32_t>(rounds_.size()); }
  /// After every round's start(): this rank's length for each chunk, for the driver's all-gather
  /// — a coded chunk's message bytes, 1 for a chunk of whole tensors alone (nothing to send, but
  /// not a failure); all 0 where any chunk failed.
  std::vector<uint64_t> lengths() const;
  /// table: every rank's lengths(), W × W row by row (row i rank i's). Raises, on every rank
  /// alike: this rank's own failure (NonFiniteError with its coordinate), else NonFiniteError
  /// naming the first rank that sent 0s, else WireError for a length over its chunk's limit.
  /// Then each coded round's next() with its chunk's column: the exchange.
  Exchange next(std::span<const uint64_t> table);

 private:
  std::vector<Round*> rounds_;
  uint32_t rank_;
};

}  // namespace sketchsgd
