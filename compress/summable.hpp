// The summable family: codecs whose worker payloads add up (dense values, sketch tables, PowerSGD
// factors). A codec writes each operation once, on float payloads:
//   SummableCodec:      sum_size(kind), do_encode_sum(grad, round, out), do_answer_sum(query, out)
//                       (two phases only), do_apply(update, step), reply_bytes(kind) (Query and
//                       Update limits), make_aggregator();
//   SummableAggregator: reduce_sum(sum, phase, contributors) → Query or Update.
// The message path is derived here once: a Gradient or Answer message is the payload in the
// codec's wire format; the server reads it, checks it is finite and adds it to the phase's sum;
// an all-reduced sum (add_sum) takes the same road past the reading. So a parameter server and a
// DDP hook run the same code on the same sums.
#pragma once

#include <sketchsgd/compress/compressor.hpp>

namespace sketchsgd {

class SummableCodec : public Compressor {
 public:
  /// formats: the wire format of the Gradient and of the Answer payload.
  SummableCodec(CodecId id, uint64_t dim, std::string spec, const Device& device,
                WireFloat gradient_format, WireFloat answer_format = WireFloat::F32);

  WireFloat sum_format(MessageKind kind) const final {
    return kind == MessageKind::Answer ? answer_format_ : gradient_format_;
  }
  /// Gradient and Answer: the summable payload in its wire format; Query and Update:
  /// reply_bytes().
  uint64_t max_payload(MessageKind kind) const final;

 protected:
  /// The largest Query (0: one phase) or Update payload.
  virtual uint64_t reply_bytes(MessageKind kind) const = 0;

 private:
  Message do_encode(std::span<const float> grad, const Header& h) final;
  Message do_answer(ByteReader& payload, const Header& query, uint32_t sender) final;
  /// A payload written to payload_ (device memory) as a message in the phase's wire format.
  Message message(const Header& h, const char* what);

  WireFloat gradient_format_, answer_format_;
  Buffer<float> payload_;       // the payload being encoded
  std::vector<float> staging_;  // its host copy (GPU)
};

class SummableAggregator : public Aggregator {
 public:
  SummableAggregator(const Compressor& codec, uint32_t world_size);

 protected:
  /// The phase's result from the sum of its payloads (in the device's memory; the codec may
  /// overwrite it) and the number of workers that contributed.
  virtual Message reduce_sum(std::span<float> sum, const Header& phase, uint32_t contributors) = 0;

 private:
  void absorb(ByteReader& payload, const Header& h) final;
  void absorb_sum(std::span<const float> sum, MessageKind kind) final;
  Message reduce(const Header& phase, uint32_t contributors) final;
  void clear() final;
  Buffer<float>& sum_of(MessageKind kind);

  Buffer<float> sum_[2];  // Gradient, Answer
  bool dirty_[2] = {false, false};
  Buffer<float> staging_;  // a message's values on their way to a GPU
  Scratch ops_;
};

}  // namespace sketchsgd
