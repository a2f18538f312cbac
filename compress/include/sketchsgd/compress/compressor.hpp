// One interface for every codec, with the three roles a parameter server needs:
//   worker:  encode(gradient) → Gradient message; answer(Query) → Answer; apply(Update) → step
//   server:  make_aggregator(W) → add() the W messages of a phase, finish() → Update (or Query)
// Steps estimate the mean gradient over the contributing workers; the caller does w −= lr · step.
// Collectives (a DDP hook) use the same codecs without a server: codecs whose payload sums across
// workers (dense values, sketch tables, PowerSGD factors) write it with encode_sum() /
// answer_sum(); an all-reduce sums it, and every rank's aggregator takes that sum with add_sum()
// in place of W messages. Other codecs' messages are all-gathered and add()ed one by one. Where a
// Query or Update is a plain float vector (reply_size() > 0: PowerSGD's factors, a dense mean),
// it can stay in device memory between phases too: Aggregator::finish_values(), answer_values()
// and apply_values() take its values instead of its bytes.
//
// Codecs come in two families (docs/CODECS.md): summable ones derive from SummableCodec
// (compress/summable.hpp), which writes their message path once; gathered ones implement encode,
// apply and an aggregator's do_add and reduce directly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/scratch.hpp>

namespace sketchsgd {

class Aggregator;
class Feedback;

/// What a message must match to belong to a codec (compress/codec_info.hpp, internal).
struct CodecInfo;

class Compressor {
 public:
  Compressor(CodecId id, uint64_t dim, std::string spec, const Device& device = Device::cpu());
  virtual ~Compressor() = default;
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  CodecId id() const { return id_; }
  /// Where gradients, steps and parameters passed to this codec live (device memory on a GPU).
  /// Messages are always host bytes.
  const Device& device() const { return device_; }
  uint64_t dim() const { return dim_; }
  /// The canonical spec with every option spelled out: make_compressor(spec(), dim()) rebuilds it.
  const std::string& spec() const { return spec_; }

  // ---- worker role ------------------------------------------------------------------------------
  /// Encodes one gradient (length dim, finite) and updates the codec's state (momentum, error
  /// feedback). On any error the state is unchanged.
  Message encode(std::span<const float> grad, uint64_t round, uint32_t sender);
  /// Second phase: the values the server asked for (codecs where two_rounds()).
  Message answer(std::span<const uint8_t> query, uint32_t sender);
  /// Writes the dense step of an Update into step (length dim) and updates the codec's state
  /// (e.g. zero momentum and error at the update's coordinates). Corrupt bytes change nothing.
  void apply(std::span<const uint8_t> update, std::span<float> step);
  /// params −= lr · step of the update, with apply()'s state change. Sparse updates touch only
  /// their coordinates (O(k), no dense step); the result is bit for bit that of apply() followed
  /// by params −= lr · step. A parameter server that keeps the model holds a codec of its own
  /// for this (whose worker state nothing reads).
  void apply_step(std::span<const uint8_t> update, std::span<float> params, float lr);

  /// The worker state (momentum, error feedback) as bytes, for checkpoints; empty for stateless
  /// codecs. load_state() takes them back (WireError when they do not fit this codec).
  Bytes save_state() const;
  void load_state(std::span<const uint8_t> state);

  // ---- collectives ------------------------------------------------------------------------------
  /// Floats of a phase's payload where it sums across workers (Gradient, Answer); 0 where it does
  /// not (such messages are gathered instead).
  virtual uint64_t sum_size(MessageKind) const { return 0; }
  /// The float format of a phase's values on the wire (the codec's `wire=`): a collective casts
  /// a float32 summable payload to it, sums, and casts the sum back.
  virtual WireFloat sum_format(MessageKind) const { return WireFloat::F32; }
  /// The payload's values as rows of this many columns, for the scales of an I8 sum
  /// (wire.hpp: i8_groups): a column's values share them. Default 1.
  virtual uint64_t sum_columns(MessageKind) const { return 1; }
  /// encode() for an all-reduce: the same checks and state change, the summable payload written
  /// to out (length sum_size(Gradient), in the device's memory) instead of a message.
  void encode_sum(std::span<const float> grad, uint64_t round, std::span<float> out);
  /// answer() for an all-reduce: the queried values written to out (length sum_size(Answer)).
  void answer_sum(std::span<const uint8_t> query, std::span<float> out);
  /// Floats of a Query or Update that is a plain float vector, 0 where it is not (a sketch's
  /// candidates, a sparse update). Its format on the wire is sum_format(kind).
  virtual uint64_t reply_size(MessageKind) const { return 0; }
  /// answer_sum() of a Query given as its values (Aggregator::finish_values(); length
  /// reply_size(Query), device memory, finite).
  void answer_values(std::span<const float> query, std::span<float> out);
  /// apply() of an Update given as its values (length reply_size(Update), device memory, finite).
  void apply_values(std::span<const float> update, std::span<float> step);

  // ---- server role ------------------------------------------------------------------------------
  virtual std::unique_ptr<Aggregator> make_aggregator(uint32_t world_size) const = 0;
  /// True when finish() of a round first returns a Query that workers must answer(): the codec
  /// has a Query message at all.
  bool two_rounds() const { return max_payload(MessageKind::Query) > 0; }

  // ---- accounting -------------------------------------------------------------------------------
  /// Largest payload a valid message of this kind can have (the decoder's limit; 0: no such
  /// message).
  virtual uint64_t max_payload(MessageKind kind) const = 0;
  /// Bytes of the last encoded gradient message, header included.
  uint64_t last_message_bytes() const { return last_bytes_; }
  /// Dense fp32 gradient bytes over the last encoded message's bytes (uplink, per worker).
  double compression_ratio() const;

  /// Decodes a message header and checks it belongs to this codec: codec id, dim, expected kind.
  Header check(std::span<const uint8_t> message, MessageKind expected) const;

 protected:
  Header make_header(MessageKind kind, uint64_t round, uint32_t sender) const;
  /// Identity, limits and payload formats, as an aggregator keeps them.
  CodecInfo info() const;

  // ---- what a codec implements (SummableCodec implements the message path itself) --------------
  /// The Gradient message of a validated gradient; on error the state is as before.
  virtual Message do_encode(std::span<const float> grad, const Header& h) = 0;
  /// The Answer to a validated Query header (payload unread).
  virtual Message do_answer(ByteReader& payload, const Header& query, uint32_t sender);
  /// The summable payloads (codecs with sum_size() > 0); out is checked by the caller.
  virtual void do_encode_sum(std::span<const float> grad, uint64_t round, std::span<float> out);
  virtual void do_answer_sum(ByteReader& payload, std::span<float> out);
  /// answer_values() and apply_values() of checked values (codecs with reply_size() > 0).
  virtual void do_answer_values(std::span<const float> query, std::span<float> out);
  virtual void do_apply_values(std::span<const float> update, std::span<float> step);
  /// Validates an Update payload completely, then writes its dense step and changes the
  /// codec's state.
  virtual void do_apply(ByteReader& payload, const Header& h, std::span<float> step) = 0;
  /// Default: the dense step in a scratch vector, then axpy. Sparse codecs override it.
  virtual void do_apply_step(ByteReader& payload, const Header& h, std::span<float> params,
                             float lr);
  /// The codec's worker state, when it keeps one: save_state()/load_state() serialise it, and
  /// SummableCodec takes a failed encode back through it.
  virtual Feedback* feedback() { return nullptr; }
  const Feedback* feedback() const { return const_cast<Compressor*>(this)->feedback(); }
  friend class Aggregator;  // keeps info()
  /// save_state()/load_state() (the device active); default: feedback()'s state. Codecs with
  /// more worker state override both; load validates everything before changing anything.
  virtual Bytes do_save_state() const;
  virtual void do_load_state(std::span<const uint8_t> state);

  /// A codec whose encode checks the gradient's finiteness in a pass of its own sets this (in
  /// its constructor): encode and encode_sum then skip their separate read of the gradient; such
  /// a codec leaves its state as it was and raises through require_finite().
  void checks_finite_itself(bool yes) { checks_finite_ = yes; }
  /// Raises NonFiniteError naming grad's first NaN or ±Inf (what: the caller), if it has one.
  void require_finite(std::span<const float> grad, const char* what) const;

  mutable Scratch ops_;  // device staging of this codec's vector ops

 private:
  /// Length, memory and finiteness of a gradient to encode (what: the caller, for messages).
  void check_gradient(std::span<const float> grad, const char* what);

  CodecId id_;
  uint64_t dim_;
  std::string spec_;
  Device device_;
  bool checks_finite_ = false;
  uint64_t last_bytes_ = 0;
  Buffer<float> step_;  // the whole step of the default apply_step
};

/// Server side of one codec for a job of world_size workers. Messages of one phase must share a
/// round; each sender contributes once per phase. add() validates the whole message before it
/// touches any state, so a rejected message changes nothing.
class Aggregator {
 public:
  Aggregator(const Compressor& codec, uint32_t world_size);
  virtual ~Aggregator() = default;

  void add(std::span<const uint8_t> message);
  /// Adds the element-wise sum of `contributors` workers' encode_sum() (or, while a second round
  /// is open, answer_sum()) outputs — an all-reduce's result — in place of their messages, as the
  /// phase's only input. sum lies in the codec's device memory (length sum_size(expecting())) and
  /// is validated (finite) before any state changes. ProtocolError for codecs that do not sum.
  void add_sum(std::span<const float> sum, uint32_t contributors, uint64_t round);
  /// Messages accepted in the current phase.
  uint32_t count() const { return count_; }
  uint32_t world_size() const { return world_; }
  /// Gradient, or Answer while a second round is open.
  MessageKind expecting() const { return expecting_; }
  /// Ends the phase with what has arrived (the W messages, or a quorum): an Update, or for
  /// two-round codecs after the Gradient phase a Query. ProtocolError when nothing arrived.
  Message finish();
  /// The kind finish() returns next: Query after a two-round codec's Gradient phase, else Update.
  MessageKind replying() const;
  /// finish() for a reply that is a float vector (reply_size(replying()) > 0): its values
  /// written to out (the codec's device memory) exactly as its message would carry them.
  void finish_values(std::span<float> out);
  /// Drops the current phase's partial merge (an aborted round); state kept across rounds stays.
  void abandon();

  /// State the server keeps across rounds (FetchSGD's momentum and error sketches), for
  /// checkpoints. Empty for codecs without any.
  virtual Bytes save_state() const { return {}; }
  /// Restores save_state() bytes; WireError when they do not fit this codec.
  virtual void load_state(std::span<const uint8_t> state);

 protected:
  /// Adds one message's payload (header checked by the caller); validates it fully before it
  /// changes any state.
  virtual void do_add(ByteReader& payload, const Header& h) = 0;
  /// Adds a summed payload of the given kind (size checked by the caller; finiteness is the
  /// codec's to check, before it touches state). SummableAggregator implements it.
  virtual void do_add_sum(std::span<const float> sum, MessageKind kind);
  /// Produces the phase's result. A Query result opens the Answer phase of the same round.
  virtual Message reduce(const Header& phase, uint32_t contributors) = 0;
  /// reduce() into the reply's values (codecs whose replies are float vectors; out checked).
  virtual void reduce_values(const Header& phase, uint32_t contributors, std::span<float> out);
  /// Drops partial state (called after finish(), before the next phase).
  virtual void clear() = 0;
  const Device device_;  ///< the codec's device: where summed payloads lie

 private:
  std::shared_ptr<const CodecInfo> held_;  // by value: an aggregator outlives its codec

 protected:
  const CodecInfo& info_;

 private:
  /// After a phase's result: the next phase, or a new round.
  void next_phase(MessageKind reply);

  uint32_t world_;
  uint32_t count_ = 0;
  uint64_t round_ = 0;
  MessageKind expecting_ = MessageKind::Gradient;
  std::vector<bool> seen_;
};

}  // namespace sketchsgd
