#include "summable.hpp"

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "codec_info.hpp"
#include "payload.hpp"

namespace sketchsgd {
namespace {
const char* payload_name(MessageKind kind) {
  switch (kind) {
    case MessageKind::Answer:
      return "answer value";
    case MessageKind::Query:
      return "query value";
    case MessageKind::Update:
      return "update value";
    default:
      return "gradient payload value";
  }
}

/// Values (host) as a message of the given header in a wire format.
Message values_message(const Header& h, std::span<const float> v, WireFloat f, const char* what,
                       uint64_t columns) {
  return Message::build(h, wire_size(f, v.size(), columns),
                        [&](ByteWriter& w) { payload::write_values(w, v, f, what, columns); });
}

/// Where a payload can be written straight into a message (host memory, fp32 on the wire): the
/// floats' room in it. The message's bytes come from the allocator and the header is 48 bytes,
/// so the room is aligned for floats. Saves a pass over the payload and its staging copy.
std::span<float> float_room(ByteWriter& w, uint64_t n) {
  static_assert(kHeaderBytes % alignof(float) == 0);
  return {reinterpret_cast<float*>(w.grow(n * sizeof(float))), n};
}
}  // namespace

SummableCodec::SummableCodec(CodecId id, uint64_t dim, std::string spec, const Device& device,
                             WireFloat gradient_format, WireFloat answer_format)
    : Compressor(id, dim, std::move(spec), device),
      gradient_format_(gradient_format),
      answer_format_(answer_format) {}

uint64_t SummableCodec::reply_bytes(MessageKind kind) const {
  return wire_size(sum_format(kind), reply_size(kind), sum_columns(kind));
}

uint64_t SummableCodec::max_payload(MessageKind kind) const {
  if (kind == MessageKind::Gradient || kind == MessageKind::Answer)
    return wire_size(sum_format(kind), sum_size(kind), sum_columns(kind));
  return reply_bytes(kind);
}

Message SummableCodec::message(const Header& h, const char* what) {
  const auto host = ops::to_host(device(), payload_.span().first(sum_size(h.kind)), staging_);
  return values_message(h, host, sum_format(h.kind), what, sum_columns(h.kind));
}

std::span<const float> SummableCodec::read_reply(ByteReader& r, MessageKind kind) {
  const uint64_t n = reply_size(kind);
  SKETCHSGD_ASSERT(n > 0, "a codec whose replies are not float vectors reads them itself");
  staging_ = payload::read_values(r, n, sum_format(kind), payload_name(kind),
                                  sum_columns(kind));  // finite
  r.expect_end();
  return ops::on_device(device(), std::span<const float>(staging_), reply_);
}

void SummableCodec::do_answer_sum(ByteReader& r, std::span<float> out) {
  do_answer_values(read_reply(r, MessageKind::Query), out);
}

void SummableCodec::do_apply(ByteReader& r, const Header&, std::span<float> step) {
  do_apply_values(read_reply(r, MessageKind::Update), step);
}

void SummableCodec::do_apply_window(std::span<const float> update, std::span<float> step,
                                    uint64_t lo, bool) {
  SKETCHSGD_REQUIRE(lo <= dim() && step.size() <= dim() - lo, InvalidArgument, "apply: values [",
                    lo, ", +", step.size(), ") of a step of ", dim());
  if (lo == 0 && step.size() == dim()) return do_apply_values(update, step);
  if (window_.size() != dim()) window_ = Buffer<float>(dim(), device());
  do_apply_values(update, window_.span());
  ops::copy(device(), step, window_.span().subspan(lo, step.size()));
}

Message SummableCodec::do_encode(std::span<const float> grad, const Header& h) {
  const uint64_t n = sum_size(MessageKind::Gradient);
  if (ops::host_memory(device()) && sum_format(MessageKind::Gradient) == WireFloat::F32)
    return Message::build(h, n * sizeof(float),
                          [&](ByteWriter& w) { do_encode_sum(grad, h.round, float_room(w, n)); });
  if (payload_.size() < n) payload_ = Buffer<float>(n, device());
  do_encode_sum(grad, h.round, payload_.span().first(n));
  try {
    return message(h, payload_name(h.kind));
  } catch (const NonFiniteError&) {
    // A value beyond the wire format's range (fp16): as if this gradient never came.
    if (Feedback* fb = feedback()) fb->undo(grad);
    throw;
  }
}

Message SummableCodec::do_answer(ByteReader& r, const Header& query, uint32_t sender) {
  const uint64_t n = sum_size(MessageKind::Answer);
  if (payload_.size() < n) payload_ = Buffer<float>(n, device());
  do_answer_sum(r, payload_.span().first(n));
  return message(make_header(MessageKind::Answer, query.round, sender),
                 payload_name(MessageKind::Answer));
}

SummableAggregator::SummableAggregator(const Compressor& codec, uint32_t world_size)
    : Aggregator(codec, world_size) {}

Buffer<float>& SummableAggregator::sum_of(MessageKind kind) {
  const size_t at = kind == MessageKind::Answer ? 1 : 0;
  Buffer<float>& s = sum_[at];
  const uint64_t n = info_.values[size_t(kind)];
  if (s.size() != n) s = Buffer<float>(n, device_);  // zeroed
  dirty_[at] = true;
  return s;
}

void SummableAggregator::do_add(ByteReader& r, const Header& h) {
  const uint64_t n = info_.values[size_t(h.kind)];
  const auto v = payload::read_values(r, n, info_.format[size_t(h.kind)], payload_name(h.kind),
                                      info_.columns[size_t(h.kind)]);  // finite-checked
  r.expect_end();
  const auto scope = device_.activate();
  ops::axpy(device_, sum_of(h.kind).span(),
            ops::on_device(device_, std::span<const float>(v), staging_), 1.0f);
}

namespace {
void check_sum(MessageKind kind, size_t bad) {
  SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, "summed ", payload_name(kind), " ", bad,
                    " is not finite");
}

void check_rounding(MessageKind kind, WireFloat f, size_t bad) {
  SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, payload_name(kind), " ", bad,
                    " does not fit ", f == WireFloat::F16 ? "fp16 (|x| < 65520)" : "bf16",
                    ": use a wider wire format");
}
}  // namespace

unsigned long long* SummableAggregator::flag(MessageKind kind) {
  static_assert(size_t(MessageKind::Gradient) < size_t(MessageKind::Query) &&
                size_t(MessageKind::Query) < size_t(MessageKind::Answer) &&
                size_t(MessageKind::Answer) < size_t(MessageKind::Update));
  if (flags_.empty()) {
    flags_ = Buffer<unsigned long long>(size_t(MessageKind::Update) + 1, device_);
    ops::clear_flags(device_, flags_.span());
  }
  flagged_ = true;
  return flags_.data() + size_t(kind);
}

void SummableAggregator::settle_checks(bool raise) {
  if (!flagged_) return;
  flagged_ = false;
  const auto scope = device_.activate();  // Round::start() calls it outside its own scope
  if (!raise) return ops::clear_flags(device_, flags_.span());
  std::vector<unsigned long long> bad(flags_.size());
  ops::take_flags(device_, flags_.span(), bad);
  for (size_t k = size_t(MessageKind::Gradient); k < bad.size(); ++k) {
    const auto kind = MessageKind(k);
    if (kind == MessageKind::Gradient || kind == MessageKind::Answer)
      check_sum(kind, bad[k]);
    else
      check_rounding(kind, info_.format[k], bad[k]);
  }
}

void SummableAggregator::do_add_sum(std::span<const float> v, MessageKind kind) {
  if (deferred_)
    ops::flag_nonfinite(device_, v, flag(kind));
  else
    check_sum(kind, ops::find_nonfinite(device_, ops_, v));
  // Added to the zeroed sum rather than copied, as messages are: 0 + x turns −0 into +0, so
  // both roads give the same bytes.
  ops::axpy(device_, sum_of(kind).span(), v, 1.0f);
}

Message SummableAggregator::reduce(const Header& phase, uint32_t contributors) {
  const auto scope = device_.activate();
  settle_checks(true);  // a codec's reduce_sum may change its state (FetchSGD's sketches)
  return reduce_sum(sum_of(phase.kind).span(), phase, contributors);
}

Message SummableAggregator::reduce_sum(std::span<float> sum, const Header& phase,
                                       uint32_t contributors) {
  const MessageKind kind = replying();
  const uint64_t n = info_.values[size_t(kind)];
  SKETCHSGD_ASSERT(n > 0, "a codec whose replies are not float vectors writes reduce_sum");
  Header h = phase;
  h.kind = kind;
  if (ops::host_memory(device_) && info_.format[size_t(kind)] == WireFloat::F32)
    return Message::build(h, n * sizeof(float), [&](ByteWriter& w) {
      reduce_to(sum, phase, contributors, float_room(w, n));
    });
  if (reply_.size() < n) reply_ = Buffer<float>(n, device_);
  const auto out = reply_.span().first(n);
  reduce_to(sum, phase, contributors, out);
  return values_message(h, ops::to_host(device_, out, host_), info_.format[size_t(kind)],
                        payload_name(kind), info_.columns[size_t(kind)]);
}

void SummableAggregator::reduce_values(const Header& phase, uint32_t contributors,
                                       std::span<float> out) {
  const MessageKind kind = replying();
  reduce_to(sum_of(phase.kind).span(), phase, contributors, out);
  // As the message would carry them: rounded to the wire format, which must hold them.
  const WireFloat f = info_.format[size_t(kind)];
  if (f == WireFloat::F32) return;
  if (deferred_)
    ops::round_half(device_, out, f == WireFloat::BF16, flag(kind));
  else
    check_rounding(kind, f, ops::round_half(device_, ops_, out, f == WireFloat::BF16));
}

void SummableAggregator::reduce_to(std::span<float>, const Header&, uint32_t, std::span<float>) {
  SKETCHSGD_ASSERT(false, "a codec with float-vector replies writes reduce_to");
}

void SummableAggregator::clear() {
  const auto scope = device_.activate();
  for (int i = 0; i < 2; ++i)
    if (dirty_[i]) sum_[i].zero();
  dirty_[0] = dirty_[1] = false;
}

}  // namespace sketchsgd
