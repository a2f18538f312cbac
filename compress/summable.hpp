// The summable family: codecs whose worker payloads add up (dense values, sketch tables, PowerSGD
// factors). A codec writes each operation once, on float payloads:
//   SummableCodec:      sum_size(kind), do_encode_sum(grad, round, out), make_aggregator(), and
//                       its replies one of two ways:
//                       - float vectors (dense, powersgd): reply_size(kind) (Query, Update),
//                         do_answer_values(query, out) (two phases only), do_apply_values;
//                       - other bytes (sketch): reply_bytes(kind), do_answer_sum(payload, out),
//                         do_apply(payload, step).
//   SummableAggregator: reduce_to(sum, phase, contributors, out) for float-vector replies, or
//                       reduce_sum(sum, phase, contributors) → Query or Update message.
// The message path is derived here once: a Gradient or Answer message is the payload in the
// codec's wire format; the server reads it, checks it is finite and adds it to the phase's sum;
// an all-reduced sum (add_sum) takes the same road past the reading. A float-vector reply is
// written in the same format, and its values, rounded to it, can stay on the device instead. So
// a parameter server and a DDP hook run the same code on the same sums.
//
// A driver that runs the phases itself (Round: a DDP hook, DiLoCo, an FSDP hook) passes values
// from the codec to its own aggregator and back. Their checks (sums finite, replies that fit a
// 16-bit wire) would each cost a host synchronisation on a GPU; under defer_checks() they go to
// flags read once by settle_checks(), and the codec takes the aggregator's replies unchecked
// (answer_deferred(), apply_settled()), before any state changes.
#pragma once

#include <sketchsgd/compress/compressor.hpp>

namespace sketchsgd {

class SummableCodec : public Compressor {
 public:
  /// formats: the wire format of the Gradient payload and of float-vector replies (fp16 where
  /// the Gradient's is I8), and of the Answer payload.
  SummableCodec(CodecId id, uint64_t dim, std::string spec, const Device& device,
                WireFloat gradient_format, WireFloat answer_format = WireFloat::F32);

  WireFloat sum_format(MessageKind kind) const final {
    if (kind == MessageKind::Answer) return answer_format_;
    if (kind == MessageKind::Gradient || gradient_format_ != WireFloat::I8) return gradient_format_;
    return WireFloat::F16;  // a reply: I8 is for sums
  }
  /// Gradient and Answer: the summable payload in its wire format; Query and Update:
  /// reply_bytes().
  uint64_t max_payload(MessageKind kind) const final;
  /// Of a phase's summable payload, the leading values that are the codec's own (those an I8
  /// sum groups by sum_columns()); the rest are values it sends as they are (PowerSGD's
  /// tensors too small to factor), which an I8 all-reduce sums in groups of their own (Round).
  /// Default: all.
  virtual uint64_t sum_grouped(MessageKind kind) const { return sum_size(kind); }

  /// The part of a step a caller keeps (a rank's shard under FSDP): the step's values
  /// [lo, lo + step.size()); streamed: memory the caller reads only later, written past the
  /// caches where the codec can (kernels::cpu::lowrank_expand's streamed).
  struct Window {
    uint64_t lo = 0;
    bool streamed = false;
  };
  /// answer_values() of a query its aggregator replied with under defer_checks(), unchecked:
  /// answering changes no state, and the aggregator's checks settle before anything does.
  void answer_deferred(std::span<const float> query, std::span<float> out) {
    do_answer_values(query, out);
  }
  /// apply_values() of an update from its aggregator after settle_checks(), unchecked: the
  /// window's part of the step written into step, with the whole step's state change.
  void apply_settled(std::span<const float> update, std::span<float> step, Window window) {
    do_apply_window(update, step, window.lo, window.streamed);
  }

 protected:
  /// The largest Query (0: one phase) or Update payload; default: reply_size() values.
  virtual uint64_t reply_bytes(MessageKind kind) const;
  /// Default: the Query's values read (reply_size(Query)) and answered with do_answer_values.
  void do_answer_sum(ByteReader& payload, std::span<float> out) override;
  /// Default: the Update's values read (reply_size(Update)) and applied with do_apply_values.
  void do_apply(ByteReader& payload, const Header& h, std::span<float> step) override;
  /// do_apply_values() that writes only the step's values [lo, lo + step.size()) (into step),
  /// with the same state change. Default: the whole step into a scratch vector, then the part
  /// copied. Codecs whose step is a product of factors (PowerSGD) override it to compute only
  /// that part; streamed: Window's.
  virtual void do_apply_window(std::span<const float> update, std::span<float> step, uint64_t lo,
                               bool streamed);

 private:
  Message do_encode(std::span<const float> grad, const Header& h) final;
  Message do_answer(ByteReader& payload, const Header& query, uint32_t sender) final;
  /// A payload written to payload_ (device memory) as a message in the phase's wire format.
  Message message(const Header& h, const char* what);
  /// A float-vector reply's values read from its payload into reply_ (device memory).
  std::span<const float> read_reply(ByteReader& r, MessageKind kind);

  WireFloat gradient_format_, answer_format_;
  Buffer<float> payload_;       // the payload being encoded
  Buffer<float> reply_;         // a reply's values on their way to a GPU
  std::vector<float> staging_;  // its host copy (GPU)
  Buffer<float> window_;        // the whole step of the default do_apply_window
};

class SummableAggregator : public Aggregator {
 public:
  SummableAggregator(const Compressor& codec, uint32_t world_size);

  /// While it lives, add_sum()'s and finish_values()' checks of the values go to flags read
  /// once, by settle_checks(); a reduce() to a message settles them before it changes any state.
  class Deferred {
   public:
    explicit Deferred(SummableAggregator& a) : a_(a) { a_.deferred_ = true; }
    ~Deferred() { a_.deferred_ = false; }
    Deferred(const Deferred&) = delete;
    Deferred& operator=(const Deferred&) = delete;

   private:
    SummableAggregator& a_;
  };
  [[nodiscard]] Deferred defer_checks() { return Deferred(*this); }
  /// Raises the first check that was deferred, as the check itself would have; with
  /// raise = false forgets them.
  void settle_checks(bool raise);

 protected:
  /// The phase's result from the sum of its payloads (in the device's memory; the codec may
  /// overwrite it) and the number of workers that contributed. Default: the values of
  /// reduce_to() as a message.
  virtual Message reduce_sum(std::span<float> sum, const Header& phase, uint32_t contributors);
  /// A float-vector reply (Query or Update, replying()) from the sum: its values into out
  /// (device memory, length reply_size()).
  virtual void reduce_to(std::span<float> sum, const Header& phase, uint32_t contributors,
                         std::span<float> out);

 private:
  void do_add(ByteReader& payload, const Header& h) final;
  void do_add_sum(std::span<const float> sum, MessageKind kind) final;
  Message reduce(const Header& phase, uint32_t contributors) final;
  void reduce_values(const Header& phase, uint32_t contributors, std::span<float> out) final;
  void clear() final;
  Buffer<float>& sum_of(MessageKind kind);
  /// The deferred check of a phase's sum (Gradient, Answer) or reply rounding (Query, Update).
  unsigned long long* flag(MessageKind kind);

  Buffer<float> sum_[2];  // Gradient, Answer
  bool dirty_[2] = {false, false};
  Buffer<float> staging_;    // a message's values on their way to a GPU
  Buffer<float> reply_;      // reduce_to()'s output for a message
  std::vector<float> host_;  // its host copy (GPU)
  Scratch ops_;
  // Deferred checks at [MessageKind] (Gradient, Query, Answer, Update: the order they would
  // raise in), each the first bad position or kernels::kNone; whether any was launched.
  Buffer<unsigned long long> flags_;
  bool flagged_ = false;
  bool deferred_ = false;  // under defer_checks()
};

}  // namespace sketchsgd
