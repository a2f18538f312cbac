#include <sketchsgd/compress/compressor.hpp>

#include <cmath>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "codec_info.hpp"

namespace sketchsgd {

Compressor::Compressor(CodecId id, uint64_t dim, std::string spec, const Device& device)
    : id_(id), dim_(dim), spec_(std::move(spec)), device_(device) {
  SKETCHSGD_REQUIRE(dim >= 1 && dim <= 0xFFFFFFFFull, InvalidArgument,
                    "compressor dim must be in [1, 2^32-1], got ", dim);
  const auto scope = device_.activate();  // CudaError now when the device does not exist
}

double Compressor::compression_ratio() const {
  return last_bytes_ ? double(dim_ * sizeof(float)) / double(last_bytes_) : 0.0;
}

CodecInfo Compressor::info() const {
  CodecInfo i{id_, dim_, {}, {}, {}, {}};
  for (auto k :
       {MessageKind::Gradient, MessageKind::Query, MessageKind::Answer, MessageKind::Update}) {
    i.max_payload[size_t(k)] = max_payload(k);
    const bool summed = k == MessageKind::Gradient || k == MessageKind::Answer;
    i.values[size_t(k)] = summed ? sum_size(k) : reply_size(k);
    i.format[size_t(k)] = sum_format(k);
    i.columns[size_t(k)] = sum_columns(k);
  }
  return i;
}

Header Compressor::check(std::span<const uint8_t> message, MessageKind expected) const {
  return info().check(message, expected);
}

Header Compressor::make_header(MessageKind kind, uint64_t round, uint32_t sender) const {
  return info().header(kind, round, sender);
}

Header CodecInfo::check(std::span<const uint8_t> message, MessageKind expected) const {
  // Identity first (codec, dim, kind), then the size limit: a message meant for another codec gets
  // a mismatch error rather than a size error.
  const Header h = decode_header(message, ~uint64_t(0));
  SKETCHSGD_REQUIRE(h.codec == id, ConfigMismatch, "message of codec ", to_string(h.codec),
                    " given to a ", to_string(id), " codec");
  SKETCHSGD_REQUIRE(h.dim == dim, ConfigMismatch, "message of dim ", h.dim,
                    " given to a codec of dim ", dim);
  SKETCHSGD_REQUIRE(h.kind == expected, ProtocolError, "expected a ", to_string(expected),
                    " message, got a ", to_string(h.kind));
  SKETCHSGD_REQUIRE(h.payload_bytes <= max_payload[size_t(expected)], WireError, to_string(h.kind),
                    " payload of ", h.payload_bytes, " bytes exceeds the codec's limit of ",
                    max_payload[size_t(expected)]);
  return h;
}

void Compressor::check_gradient(std::span<const float> grad, const char* what) {
  SKETCHSGD_REQUIRE(grad.size() == dim_, InvalidArgument, what, ": gradient of length ",
                    grad.size(), " for a codec of dim ", dim_);
  device_.require_accessible(grad.data(), grad.size_bytes(), what);
  if (!checks_finite_) require_finite(grad, what);
}

void Compressor::require_finite(std::span<const float> grad, const char* what) const {
  const size_t bad = ops::find_nonfinite(device_, ops_, grad);
  if (bad != kernels::kNone) {
    float value = 0.0f;
    detail::copy_bytes(&value, grad.data() + bad, sizeof(float), device_);
    detail::raise<NonFiniteError>(what, ": non-finite value ", value, " at coordinate ", bad);
  }
}

Message Compressor::encode(std::span<const float> grad, uint64_t round, uint32_t sender) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(sender != kServerRank, InvalidArgument, "encode: sender id ", sender,
                    " is reserved for the server");
  check_gradient(grad, "encode");
  Message m = do_encode(grad, make_header(MessageKind::Gradient, round, sender));
  last_bytes_ = m.size();
  return m;
}

Message Compressor::answer(std::span<const uint8_t> query, uint32_t sender) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(two_rounds(), ProtocolError, "codec ", spec_, " has no second round");
  const Header h = check(query, MessageKind::Query);
  ByteReader r(payload_of(query), "query payload");
  return do_answer(r, h, sender);
}

Message Compressor::do_answer(ByteReader&, const Header&, uint32_t) {
  throw ProtocolError("codec " + spec_ + " has no second round");
}

void Compressor::encode_sum(std::span<const float> grad, uint64_t round, std::span<float> out) {
  const auto scope = device_.activate();
  const uint64_t n = sum_size(MessageKind::Gradient);
  SKETCHSGD_REQUIRE(n > 0, ProtocolError, "codec ", spec_,
                    " has no summable payload: gather its messages instead");
  SKETCHSGD_REQUIRE(out.size() == n, InvalidArgument, "encode_sum: output of length ", out.size(),
                    ", the codec's summable payload has ", n);
  device_.require_accessible(out.data(), out.size_bytes(), "encode_sum: output");
  check_gradient(grad, "encode_sum");
  do_encode_sum(grad, round, out);
  last_bytes_ = n * sizeof(float);
}

void Compressor::answer_sum(std::span<const uint8_t> query, std::span<float> out) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(two_rounds(), ProtocolError, "codec ", spec_, " has no second round");
  const uint64_t n = sum_size(MessageKind::Answer);
  SKETCHSGD_REQUIRE(out.size() == n, InvalidArgument, "answer_sum: output of length ", out.size(),
                    ", the codec's answer has ", n);
  device_.require_accessible(out.data(), out.size_bytes(), "answer_sum: output");
  check(query, MessageKind::Query);
  ByteReader r(payload_of(query), "query payload");
  do_answer_sum(r, out);
}

namespace {
/// NonFiniteError naming the first NaN/±Inf of values given instead of a message (what: the
/// caller and the values).
void require_finite_values(const Device& d, Scratch& s, std::span<const float> v,
                           const char* what) {
  const size_t bad = ops::find_nonfinite(d, s, v);
  SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, what, " ", bad, " is not finite");
}
}  // namespace

void Compressor::answer_values(std::span<const float> query, std::span<float> out) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(two_rounds(), ProtocolError, "codec ", spec_, " has no second round");
  const uint64_t n = reply_size(MessageKind::Query);
  SKETCHSGD_REQUIRE(n > 0, ProtocolError, "codec ", spec_,
                    "'s query is not a float vector: answer its message");
  SKETCHSGD_REQUIRE(query.size() == n, InvalidArgument, "answer_values: query of length ",
                    query.size(), ", the codec's query has ", n);
  SKETCHSGD_REQUIRE(out.size() == sum_size(MessageKind::Answer), InvalidArgument,
                    "answer_values: output of length ", out.size(), ", the codec's answer has ",
                    sum_size(MessageKind::Answer));
  device_.require_accessible(query.data(), query.size_bytes(), "answer_values: query");
  device_.require_accessible(out.data(), out.size_bytes(), "answer_values: output");
  require_finite_values(device_, ops_, query, "answer_values: query value");
  do_answer_values(query, out);
}

void Compressor::apply_values(std::span<const float> update, std::span<float> step) {
  const auto scope = device_.activate();
  const uint64_t n = reply_size(MessageKind::Update);
  SKETCHSGD_REQUIRE(n > 0, ProtocolError, "codec ", spec_,
                    "'s update is not a float vector: apply its message");
  SKETCHSGD_REQUIRE(update.size() == n, InvalidArgument, "apply_values: update of length ",
                    update.size(), ", the codec's update has ", n);
  SKETCHSGD_REQUIRE(step.size() == dim_, InvalidArgument, "apply_values: step of length ",
                    step.size(), " for a codec of dim ", dim_);
  device_.require_accessible(update.data(), update.size_bytes(), "apply_values: update");
  device_.require_accessible(step.data(), step.size_bytes(), "apply_values: step");
  require_finite_values(device_, ops_, update, "apply_values: update value");
  do_apply_values(update, step);
}

void Compressor::do_answer_values(std::span<const float>, std::span<float>) {
  throw ProtocolError("codec " + spec_ + "'s query is not a float vector");
}

void Compressor::do_apply_values(std::span<const float>, std::span<float>) {
  throw ProtocolError("codec " + spec_ + "'s update is not a float vector");
}

void Compressor::do_encode_sum(std::span<const float>, uint64_t, std::span<float>) {
  throw ProtocolError("codec " + spec_ + " has no summable payload");
}

void Compressor::do_answer_sum(ByteReader&, std::span<float>) {
  throw ProtocolError("codec " + spec_ + " has no summable answer");
}

Bytes Compressor::save_state() const {
  const auto scope = device_.activate();
  return do_save_state();
}

void Compressor::load_state(std::span<const uint8_t> state) {
  const auto scope = device_.activate();
  do_load_state(state);
}

Bytes Compressor::do_save_state() const {
  const Feedback* fb = feedback();
  return fb && fb->stateful() ? fb->save() : Bytes{};
}

void Compressor::do_load_state(std::span<const uint8_t> state) {
  Feedback* fb = feedback();
  if (!fb || !fb->stateful()) {
    SKETCHSGD_REQUIRE(state.empty(), WireError, "codec ", spec_, " keeps no worker state, got ",
                      state.size(), " bytes");
    return;
  }
  fb->load(state);
}

void Compressor::apply(std::span<const uint8_t> update, std::span<float> step) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(step.size() == dim_, InvalidArgument, "apply: step of length ", step.size(),
                    " for a codec of dim ", dim_);
  device_.require_accessible(step.data(), step.size_bytes(), "apply: step");
  const Header h = check(update, MessageKind::Update);
  ByteReader r(payload_of(update), "update payload");
  do_apply(r, h, step);
}

namespace {
void check_step_args(std::span<float> params, uint64_t dim, float lr, const Device& device) {
  SKETCHSGD_REQUIRE(params.size() == dim, InvalidArgument, "step: parameters of length ",
                    params.size(), " for a codec of dim ", dim);
  device.require_accessible(params.data(), params.size_bytes(), "step: parameters");
  SKETCHSGD_REQUIRE(std::isfinite(lr), InvalidArgument, "step: learning rate ", lr,
                    " is not finite");
}
}  // namespace

void Compressor::apply_step(std::span<const uint8_t> update, std::span<float> params, float lr) {
  const auto scope = device_.activate();
  check_step_args(params, dim_, lr, device_);
  const Header h = check(update, MessageKind::Update);
  ByteReader r(payload_of(update), "update payload");
  do_apply_step(r, h, params, lr);
}

void Compressor::do_apply_step(ByteReader& r, const Header& h, std::span<float> params, float lr) {
  if (step_.size() != dim_) step_ = Buffer<float>(dim_, device_);
  do_apply(r, h, step_.span());
  ops::axpy(device_, params, step_.span(), -lr);
}

Aggregator::Aggregator(const Compressor& codec, uint32_t world_size)
    : device_(codec.device()),
      held_(std::make_shared<const CodecInfo>(codec.info())),
      info_(*held_),
      world_(world_size),
      seen_(world_size, false) {
  SKETCHSGD_REQUIRE(world_size >= 1 && world_size <= 65536, InvalidArgument,
                    "aggregator world size must be in [1, 65536], got ", world_size);
}

void Aggregator::add(std::span<const uint8_t> message) {
  const Header h = info_.check(message, expecting_);
  SKETCHSGD_REQUIRE(h.sender < world_, ProtocolError, "message from sender ", h.sender,
                    " in a job of ", world_, " workers");
  const bool opens_round = count_ == 0 && expecting_ == MessageKind::Gradient;
  SKETCHSGD_REQUIRE(opens_round || h.round == round_, ProtocolError, "message of round ", h.round,
                    " while collecting round ", round_);
  SKETCHSGD_REQUIRE(!seen_[h.sender], ProtocolError, "duplicate ", to_string(h.kind),
                    " from sender ", h.sender, " in round ", h.round);
  ByteReader r(payload_of(message), "payload");
  do_add(r, h);  // validates fully before changing state
  if (count_ == 0) round_ = h.round;
  seen_[h.sender] = true;
  ++count_;
}

void Aggregator::add_sum(std::span<const float> sum, uint32_t contributors, uint64_t round) {
  const uint64_t n = info_.values[size_t(expecting_)];
  SKETCHSGD_REQUIRE(n > 0, ProtocolError, "codec ", to_string(info_.id), " cannot take a summed ",
                    to_string(expecting_), ": add its messages one by one");
  SKETCHSGD_REQUIRE(sum.size() == n, InvalidArgument, "add_sum: ", sum.size(), " values for a ",
                    to_string(expecting_), " sum of ", n);
  SKETCHSGD_REQUIRE(count_ == 0, ProtocolError, "add_sum: the phase already has ", count_,
                    " contributions");
  SKETCHSGD_REQUIRE(contributors >= 1 && contributors <= world_, InvalidArgument,
                    "add_sum: ", contributors, " contributors in a job of ", world_, " workers");
  const bool opens_round = expecting_ == MessageKind::Gradient;
  SKETCHSGD_REQUIRE(opens_round || round == round_, ProtocolError, "sum of round ", round,
                    " while collecting round ", round_);
  device_.require_accessible(sum.data(), sum.size_bytes(), "add_sum");
  const auto scope = device_.activate();
  do_add_sum(sum, expecting_);  // validates fully before changing state
  round_ = round;
  seen_.assign(world_, true);
  count_ = contributors;
}

void Aggregator::do_add_sum(std::span<const float>, MessageKind kind) {
  throw ProtocolError("codec " + std::string(to_string(info_.id)) + " cannot take a summed " +
                      std::string(to_string(kind)));
}

void Aggregator::abandon() {
  clear();
  count_ = 0;
  seen_.assign(world_, false);
  expecting_ = MessageKind::Gradient;
}

void Aggregator::load_state(std::span<const uint8_t> state) {
  SKETCHSGD_REQUIRE(state.empty(), WireError, "codec ", to_string(info_.id),
                    " keeps no server state, got ", state.size(), " bytes");
}

Message Aggregator::finish() {
  SKETCHSGD_REQUIRE(count_ > 0, ProtocolError, "finish: no ", to_string(expecting_),
                    " message arrived");
  Message out = reduce(info_.header(expecting_, round_, kServerRank), count_);
  next_phase(out.kind());
  return out;
}

MessageKind Aggregator::replying() const {
  const bool query =
      expecting_ == MessageKind::Gradient && info_.max_payload[size_t(MessageKind::Query)] > 0;
  return query ? MessageKind::Query : MessageKind::Update;
}

void Aggregator::finish_values(std::span<float> out) {
  SKETCHSGD_REQUIRE(count_ > 0, ProtocolError, "finish_values: no ", to_string(expecting_),
                    " message arrived");
  const MessageKind kind = replying();
  const uint64_t n = info_.values[size_t(kind)];
  SKETCHSGD_REQUIRE(n > 0, ProtocolError, "codec ", to_string(info_.id), "'s ", to_string(kind),
                    " is not a float vector: finish() it as a message");
  SKETCHSGD_REQUIRE(out.size() == n, InvalidArgument, "finish_values: output of length ",
                    out.size(), ", the ", to_string(kind), " has ", n);
  device_.require_accessible(out.data(), out.size_bytes(), "finish_values: output");
  const auto scope = device_.activate();
  reduce_values(info_.header(expecting_, round_, kServerRank), count_, out);
  next_phase(kind);
}

void Aggregator::reduce_values(const Header&, uint32_t, std::span<float>) {
  throw ProtocolError("codec " + std::string(to_string(info_.id)) +
                      "'s replies are not float vectors");
}

void Aggregator::next_phase(MessageKind reply) {
  clear();
  count_ = 0;
  seen_.assign(world_, false);
  // A Query opens the Answer phase of this round.
  expecting_ = reply == MessageKind::Query ? MessageKind::Answer : MessageKind::Gradient;
}

}  // namespace sketchsgd
