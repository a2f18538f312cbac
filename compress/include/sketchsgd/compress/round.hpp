// One unit's exchange among the W ranks of a collective group, for drivers that own the network
// (the DDP hook, DiLoCo's average, an FSDP hook): the codec's phases written once per family as
// requests the driver runs, then the mean. A rank holds a Round per unit, with its codec (the
// rank's worker state) and a replica of the aggregator; every rank's replica sees the same sums
// and messages, so every rank computes the same update.
//
//   start(buffer, at, round) → requests;
//   [next(gathered) → requests;]
//   finish(gathered, buffer, at)
//
// The unit's tensors lie in the driver's buffer (a DDP bucket, a shard) at runs of offsets: the
// compressed ones (the codec's vector, end to end) and the ones sent whole; the round reads them
// there and writes the mean back there.
//
// A request is Exchange (an all-to-all: parts[r] to rank r, all of one length, and from each
// rank its part for this one, in rank order, to the next call), Sum (an all-reduce, in place, of
// one of the driver's rooms, summed in the codec's wire format: the driver casts to it and back;
// I8: its groups' largest magnitudes all-reduced by max first, then the integers at 127 / W levels
// summed, wire.hpp) or Gather (an all-gather of bytes of the same length on every rank; every
// rank's copy comes back to the next call, in rank order). Families:
//   summable (dense, sketch, powersgd): Sum(codec payload ++ whole tensors) (I8: Sum(the
//     codec's own values) and Sum(the values sent as they are) in I8 by one column); for
//     two-round codecs then Sum(answer);
//   gathered (topk, signsgd, terngrad, qsgd): Gather(message length), then Gather(the message
//     padded to the longest) and Sum(whole tensors);
//   sparse lists under reduce=sparse (topk, sparseloco): the sparse all-reduce
//     (sparse_reduce.hpp) in six phases, Gather, Exchange, Sum(whole tensors ++ the magnitudes'
//     counts), Sum(the finer counts), Gather, Gather (compress/sparse_phases.hpp): each rank's
//     link O(k), not O(W · k);
//   nothing compressed: Sum(whole tensors).
// The tensors sent whole (small ones, by the layout rule: Layout::sent_whole) travel beside the
// codec's payload (summable: in its Sum and wire format, beside I8 in I8 groups of their own;
// gathered: an fp32 Sum) and are averaged with float32(1/W), as the aggregators average.
//
// A rank whose gradient is not finite (what it compresses, or a tensor it sends whole: checked
// before the encode, so the codec's state stays as it was) still runs every collective of the
// phase it is in, so that no other rank waits for it, and tells the others: a summable payload of
// NaN (nothing finite sums to NaN), a message length of 0. Every rank then raises NonFiniteError,
// with no update anywhere and that rank's codec state as before (the others' encodes went
// through: their error feedback holds the step). A step that failed leaves no phase open: the
// next start() begins afresh.
//
// The checks of the values the round passes between its codec and aggregator (sums finite,
// replies that fit a 16-bit wire) are deferred to one read at finish(), before any state changes:
// on a GPU each would otherwise cost a host synchronisation. A two-round codec whose query is a
// float vector so runs both phases on every rank and raises at finish(); one whose query is a
// message (it is built on the host anyway) raises after the first.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/core/scratch.hpp>

namespace sketchsgd {

class SummableCodec;
class SummableAggregator;
class SparsePhases;

class Round {
 public:
  enum class Op : uint8_t { Sum, Gather, Exchange };
  /// The driver's float32 rooms the round's sums are written into, in the codec's device memory;
  /// they must outlive the round. Lengths: payload_size() and answer_size().
  struct Rooms {
    std::span<float> payload, answer;
  };
  struct Request {
    Op op;
    /// Sum: which room (0 payload, 1 answer), the format to sum it in and, for I8, the room's
    /// columns (wire.hpp: i8_groups); the room's values [offset, offset + count), all of it
    /// where count is 0.
    int room = 0;
    WireFloat format = WireFloat::F32;
    uint64_t columns = 1;
    uint64_t offset = 0, count = 0;
    /// Gather: this rank's bytes (host memory, valid until the next call).
    std::span<const uint8_t> bytes;
    /// Exchange: this rank's part for each rank, all of one length (host memory, valid until
    /// the next call).
    std::vector<std::span<const uint8_t>> parts;

    static Request sum(int room, WireFloat format, uint64_t columns = 1, uint64_t offset = 0,
                       uint64_t count = 0) {
      return {Op::Sum, room, format, columns, offset, count, {}, {}};
    }
    static Request gather(std::span<const uint8_t> bytes) {
      return {Op::Gather, 0, WireFloat::F32, 1, 0, 0, bytes, {}};
    }
    static Request exchange(std::vector<std::span<const uint8_t>> parts) {
      return {Op::Exchange, 0, WireFloat::F32, 1, 0, 0, {}, std::move(parts)};
    }
  };

  /// Where the unit's tensors lie in the buffer, in the unit's order: the compressed ones
  /// (codec.dim() values in all) and the ones sent whole.
  struct Runs {
    std::span<const Layout::Run> kept, whole;
  };

  /// A unit with compressed tensors (codec.dim() values) and `whole` values sent whole. The
  /// codec and aggregator (of this rank; aggregator.world_size() ranks) outlive the round.
  /// per_destination: a chunk's round of a reduce-scatter per destination (Scatter), whose
  /// messages go to one rank each: gathered, never a sparse all-reduce (reduce=sparse), which
  /// has no place there.
  Round(Compressor& codec, Aggregator& aggregator, uint32_t rank, uint64_t whole, Rooms rooms,
        bool per_destination = false);
  /// A unit of whole tensors only (`whole` values, world ranks).
  Round(uint32_t world, uint64_t whole, const Device& device, std::span<float> payload);
  ~Round();

  static uint64_t payload_size(const Compressor* codec, uint64_t whole,
                               bool per_destination = false);
  static uint64_t answer_size(const Compressor* codec);
  /// Collective steps a round takes: 6 under reduce=sparse, 2 for gathered and two-round codecs,
  /// else 1.
  int phases() const;

  /// A new step's first requests, from the unit's values in buffer (the codec's device memory;
  /// read here, not kept).
  std::vector<Request> start(std::span<const float> buffer, Runs at, uint64_t round);
  /// After the requests' collectives completed (Sums in place; gathered: every rank's bytes per
  /// Gather request, request by request, rank by rank): the next phase's requests.
  std::vector<Request> next(std::span<const std::span<const uint8_t>> gathered);
  /// After the last phase: the mean estimate of the compressed tensors and the whole tensors'
  /// mean written into buffer at the runs, with the codec's state change. Raises NonFiniteError
  /// (this or another rank's input was not finite) or WireError (a rank sent what does not
  /// decode).
  void finish(std::span<const std::span<const uint8_t>> gathered, std::span<float> buffer, Runs at);
  /// finish() that writes only the buffer's values [lo, lo + out.size()), into out, of a buffer
  /// of n values (the runs' offsets are the buffer's): for a driver that keeps a part of the
  /// mean (a rank's shard under FSDP), without the rest written or copied. The codec computes
  /// only that part where it can (SummableCodec::apply_settled); its state changes as under
  /// finish(). out is taken to be the driver's own memory, not in cache and read only after the
  /// round (FSDP's output, new each call): a codec that computes its part writes it by streaming
  /// stores on the CPU (PowerSGD at ranks up to 4), without fetching its lines first.
  void finish(std::span<const std::span<const uint8_t>> gathered, std::span<float> out, uint64_t lo,
              uint64_t n, Runs at);

  uint32_t world() const { return world_; }
  /// Whether the unit has compressed tensors (a codec), not only tensors sent whole.
  bool compresses() const { return codec_ != nullptr; }
  /// After start(): whether this rank's input failed its checks (it then tells the others through
  /// the step's collectives, and raises at the next call).
  bool failed() const { return failed_ != nullptr; }
  /// Raises that failure (NonFiniteError with its coordinate), if any.
  void rethrow_own() const;
  /// A gathered round after start(): this rank's message bytes (0 where it failed).
  uint64_t message_size() const { return message_.bytes().size(); }
  /// A gathered round: the most bytes any rank's message may hold.
  uint64_t message_limit() const;

  /// Whether the round gathers messages (a gathered codec): its update is then the aggregator's
  /// mean of every rank's message, which every rank's finish() computes alike.
  bool gathered() const { return codec_ && !summable() && !sparse_; }
  /// Whether the round is a sparse all-reduce (a sparse-list codec with reduce=sparse).
  bool sparse() const { return sparse_ != nullptr; }
  /// A gathered round after its last phase: the step's update from every rank's message (what
  /// finish() applies), for ranks that share one process (a simulated group): one rank reduces,
  /// every rank's finish_update() applies it, so a group decodes W messages once, not W times
  /// (at W = 256 a top-k step's W² decodes were most of its time). Raises as finish() would.
  Message reduce(std::span<const std::span<const uint8_t>> gathered);
  /// finish() with the update reduce() made on any rank of the group from the same messages.
  /// Raises what finish() would for this rank's own failure, or WireError for an update that is
  /// not one of this codec's.
  void finish_update(std::span<const uint8_t> update, std::span<float> buffer, Runs at);

 private:
  /// Both finish()es and finish_update(): streamed, the window's (SummableCodec::Window);
  /// update, a gathered round's update (empty: reduced here from gathered).
  void finish_into(std::span<const std::span<const uint8_t>> gathered,
                   std::span<const uint8_t> update, std::span<float> out, uint64_t lo, uint64_t n,
                   Runs at, bool streamed);
  bool summable() const { return summable_ != nullptr; }
  /// The Sum of a room in the format of the codec's payload of that kind.
  Request sum_request(int room, MessageKind kind) const {
    return Request::sum(room, codec_->sum_format(kind), codec_->sum_columns(kind));
  }
  /// The first phase's Sums of the payload room: the codec's payload and the tensors sent whole
  /// beside it in its format, but beside an I8 payload (its values that are the codec's own:
  /// sum_grouped) those sent as they are in I8 groups of their own, one column (its scales go
  /// by the codec's columns, which they are not).
  std::vector<Request> payload_sums() const;
  /// NonFiniteError naming the first NaN/±Inf among the tensors sent whole (whole: their values
  /// end to end, as gathered from the buffer's runs), or null. On a GPU one read-back a start.
  std::exception_ptr check_whole(std::span<const float> whole, std::span<const Layout::Run> runs);
  /// After a sum: this rank's failure, or another's (NaN in the payload's first value).
  void check_sum() const;
  /// The aggregator takes a phase's sum, its checks deferred.
  void add_sum(std::span<const float> sum);
  /// The aggregator's Query or Update: into a float room when it is a float vector (no host copy
  /// between phases; checks deferred), else a message.
  void reply(MessageKind kind, Buffer<float>& room, Message& message);
  /// Raises what the deferred checks found, with whose fault it was.
  void settle();
  /// f(), a WireError from the aggregator's checks of a sum told as another rank's failure
  /// where one signalled it.
  template <class F>
  void attributed(F&& f);
  std::vector<Request> padded(std::span<const std::span<const uint8_t>> lengths);
  /// next() under reduce=sparse: the phase after phase_.
  std::vector<Request> next_sparse(std::span<const std::span<const uint8_t>> gathered);
  /// The runs' values in out (the buffer's [lo, lo + out.size())) = float32(1/W) · sum, the
  /// runs' values end to end.
  void mean_into(std::span<const float> sum, std::span<float> out, uint64_t lo,
                 std::span<const Layout::Run> runs) const;
  void require(std::span<const float> v, uint64_t n, const char* what) const;
  /// Checks runs lie in a buffer of n values and hold `values` in all (what: which runs).
  void require(std::span<const Layout::Run> runs, uint64_t n, uint64_t values,
               const char* what) const;

  Compressor* codec_ = nullptr;
  Aggregator* aggregator_ = nullptr;
  // The codec's family (compress/summable.hpp): both set for a summable codec, else null.
  SummableCodec* summable_ = nullptr;
  SummableAggregator* summed_ = nullptr;
  std::unique_ptr<SparsePhases> sparse_;  // reduce=sparse
  uint32_t world_, rank_;
  uint64_t whole_, sum_size_ = 0;
  bool dense_ = false;
  Device device_;
  Rooms rooms_;
  Scratch scratch_;  // the whole tensors' check on a GPU
  float inv_;        // float32(1/W), as the aggregators average

  uint64_t round_ = 0;
  int phase_ = 0;
  std::exception_ptr failed_;     // this rank's NonFiniteError, held to the end of the step
  Message message_;               // gathered: this rank's message
  uint8_t length_[8] = {};        // its length, little-endian
  std::vector<uint8_t> padded_;   // the message padded to the longest of the step
  std::vector<uint64_t> sizes_;   // every rank's message length
  Buffer<float> query_, update_;  // float-vector replies
  Buffer<float> x_, step_;        // the compressed values end to end, where they are not already
};

}  // namespace sketchsgd
