#include <sketchsgd/compress/round.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "sparse_phases.hpp"
#include "summable.hpp"

namespace sketchsgd {

Round::Round(Compressor& codec, Aggregator& aggregator, uint32_t rank, uint64_t whole, Rooms rooms,
             bool per_destination)
    : codec_(&codec),
      aggregator_(&aggregator),
      summable_(dynamic_cast<SummableCodec*>(&codec)),
      summed_(dynamic_cast<SummableAggregator*>(&aggregator)),
      world_(aggregator.world_size()),
      rank_(rank),
      whole_(whole),
      sum_size_(codec.sum_size(MessageKind::Gradient)),
      dense_(codec.id() == CodecId::Dense),
      device_(codec.device()),
      rooms_(rooms),
      inv_(1.0f / static_cast<float>(world_)) {
  SKETCHSGD_REQUIRE(rank < world_, InvalidArgument, "round: rank ", rank, " in a group of ",
                    world_);
  SKETCHSGD_REQUIRE(!summable_ == !summed_, InvalidArgument, "round: codec ", codec.spec(),
                    " with an aggregator of another family");
  require(rooms.payload, payload_size(&codec, whole, per_destination), "payload room");
  require(rooms.answer, answer_size(&codec), "answer room");
  if (auto* lists = dynamic_cast<SparseListCodec*>(&codec);
      lists && lists->reduces_sparse() && !per_destination)
    sparse_ = std::make_unique<SparsePhases>(*lists, codec.dim(), world_, rank);
}

Round::~Round() = default;

namespace {
bool reduces_sparse(const Compressor* codec) {
  const auto* lists = dynamic_cast<const SparseListCodec*>(codec);
  return lists && lists->reduces_sparse();
}
}  // namespace

Round::Round(uint32_t world, uint64_t whole, const Device& device, std::span<float> payload)
    : world_(world),
      rank_(0),
      whole_(whole),
      device_(device),
      rooms_{payload, {}},
      inv_(1.0f / static_cast<float>(world)) {
  SKETCHSGD_REQUIRE(world >= 1, InvalidArgument, "round: a group of 0 ranks");
  SKETCHSGD_REQUIRE(whole > 0, InvalidArgument, "round: a unit with nothing to send");
  require(payload, whole, "payload room");
}

uint64_t Round::payload_size(const Compressor* codec, uint64_t whole, bool per_destination) {
  // Under reduce=sparse the magnitudes' counts follow the tensors sent whole, in their Sum.
  return (dynamic_cast<const SummableCodec*>(codec) ? codec->sum_size(MessageKind::Gradient) : 0) +
         whole + (reduces_sparse(codec) && !per_destination ? sparse::kBuckets : 0);
}

uint64_t Round::answer_size(const Compressor* codec) {
  return dynamic_cast<const SummableCodec*>(codec) ? codec->sum_size(MessageKind::Answer) : 0;
}

int Round::phases() const {
  if (!codec_) return 1;
  if (sparse_) return 6;
  return summable() && !codec_->two_rounds() ? 1 : 2;
}

void Round::require(std::span<const float> v, uint64_t n, const char* what) const {
  SKETCHSGD_REQUIRE(v.size() == n, InvalidArgument, "round: ", what, " of ", v.size(),
                    " values, expected ", n);
  if (n) device_.require_accessible(v.data(), v.size_bytes(), what);
}

void Round::require(std::span<const Layout::Run> runs, uint64_t n, uint64_t values,
                    const char* what) const {
  uint64_t total = 0;
  for (const auto& r : runs) {
    SKETCHSGD_REQUIRE(r.offset <= n && r.numel <= n - r.offset, InvalidArgument, "round: ", what,
                      " run [", r.offset, ", +", r.numel, ") past a buffer of ", n, " values");
    total += r.numel;
  }
  SKETCHSGD_REQUIRE(total == values, InvalidArgument, "round: ", what, " runs hold ", total,
                    " values, expected ", values);
}

namespace {
/// The pieces that move the runs of a buffer, seen through `window` (its values [lo, lo +
/// window.size())), to b end to end, or (to_runs) back: the parts of the runs inside the window.
/// One launch on a GPU, where a copy per run was a host call each (a DDP bucket interleaves
/// weights and biases: three runs each way for an MLP of three layers).
std::vector<kernels::Piece> pieces(std::span<const float> window, uint64_t lo,
                                   std::span<const Layout::Run> runs, const float* b,
                                   bool to_runs) {
  std::vector<kernels::Piece> out;
  out.reserve(runs.size());
  const uint64_t hi = lo + window.size();
  uint64_t at = 0;
  for (const auto& r : runs) {
    const uint64_t from = std::max(r.offset, lo), to = std::min(r.offset + r.numel, hi);
    if (from < to) {
      float* run = const_cast<float*>(window.data()) + (from - lo);
      float* packed = const_cast<float*>(b) + at + (from - r.offset);
      out.push_back(to_runs ? kernels::Piece{run, packed, to - from}
                            : kernels::Piece{packed, run, to - from});
    }
    at += r.numel;
  }
  return out;
}

/// The runs of buffer end to end in out.
void gather_runs(const Device& d, std::span<const float> buffer, std::span<const Layout::Run> runs,
                 std::span<float> out) {
  ops::scale_pieces(d, pieces(buffer, 0, runs, out.data(), false), 1.0f);
}

/// The compressed values as one span: the buffer's own where they are one run.
template <class Span>
Span one_run(Span buffer, std::span<const Layout::Run> runs) {
  return runs.size() == 1 ? buffer.subspan(runs[0].offset, runs[0].numel) : Span();
}
}  // namespace

std::vector<Round::Request> Round::start(std::span<const float> buffer, Runs at, uint64_t round) {
  require(buffer, buffer.size(), "buffer");
  require(at.whole, buffer.size(), whole_, "whole");
  require(at.kept, buffer.size(), codec_ ? codec_->dim() : 0, "compressed");
  // A failed step may have left a phase open (a rank's sum refused after the query): drop it.
  if (aggregator_ &&
      (aggregator_->count() > 0 || aggregator_->expecting() != MessageKind::Gradient))
    aggregator_->abandon();
  if (summed_) summed_->settle_checks(false);  // a failed step's, never read
  round_ = round;
  phase_ = 0;
  failed_ = nullptr;
  const auto scope = device_.activate();
  const std::span<float> payload = rooms_.payload;
  gather_runs(device_, buffer, at.whole, payload.subspan(sum_size_));
  failed_ = check_whole(payload.subspan(sum_size_, whole_), at.whole);
  if (!codec_) {
    // Everyone's sum NaN throughout: every rank reads its first value at finish().
    if (failed_) ops::scale(device_, payload, std::numeric_limits<float>::quiet_NaN());
    return {Request::sum(0, WireFloat::F32)};
  }
  if (failed_) {  // told as a failed encode would tell it; the codec's state untouched
    if (summable()) {
      ops::scale(device_, payload.first(sum_size_), std::numeric_limits<float>::quiet_NaN());
      return payload_sums();
    }
    message_ = Message();
    if (sparse_) return {Request::gather(sparse_->start({}))};
    std::fill(std::begin(length_), std::end(length_), uint8_t(0));
    return {Request::gather(length_)};
  }
  std::span<const float> x = one_run(buffer, at.kept);
  if (x.empty()) {
    if (x_.size() != codec_->dim()) x_ = Buffer<float>(codec_->dim(), device_);
    gather_runs(device_, buffer, at.kept, x_.span());
    x = x_.span();
  }
  if (summable()) {
    try {
      codec_->encode_sum(x, round, payload.first(sum_size_));
    } catch (const NonFiniteError&) {
      // Join the others' all-reduce rather than leave them waiting, and tell them through it:
      // x · NaN is NaN for every x, and nothing finite sums to NaN.
      failed_ = std::current_exception();
      ops::scale(device_, payload.first(sum_size_), std::numeric_limits<float>::quiet_NaN());
    }
    return payload_sums();
  }
  try {
    message_ = codec_->encode(x, round, rank_);
  } catch (const NonFiniteError&) {  // a length of 0: every rank stops after the lengths
    failed_ = std::current_exception();
    message_ = Message();
  }
  if (sparse_) return {Request::gather(sparse_->start(message_.bytes()))};
  uint64_t n = message_.bytes().size();
  for (auto& b : length_) {
    b = uint8_t(n & 0xFF);
    n >>= 8;
  }
  return {Request::gather(length_)};
}

std::vector<Round::Request> Round::payload_sums() const {
  Request sum = sum_request(0, MessageKind::Gradient);
  if (sum.format != WireFloat::I8) return {sum};
  // The values sent as they are (the codec's own, and the unit's tensors sent whole) share no
  // column with the codec's: grouped with them they would be rounded to 127 / W levels of the
  // largest of whatever kI8Rows rows fell together, with no error feedback to take it back
  // (docs/RESULTS.md, "Sharded models: FSDP2", has what that cost the GPT-2 job). In groups of
  // their own (runs of kI8Rows consecutive values, one column) they keep what F16 keeps at half its
  // bytes.
  const uint64_t own = summable_->sum_grouped(MessageKind::Gradient),
                 rest = sum_size_ - own + whole_;
  if (rest == 0) return {sum};
  if (own == 0) return {Request::sum(0, WireFloat::I8)};
  sum.count = own;
  return {sum, Request::sum(0, WireFloat::I8, 1, own, rest)};
}

std::vector<Round::Request> Round::next(std::span<const std::span<const uint8_t>> gathered) {
  SKETCHSGD_REQUIRE(phase_ + 1 < phases(), ProtocolError, "round: next() after the last phase");
  if (sparse_) {
    auto out = next_sparse(gathered);
    ++phase_;
    return out;
  }
  if (!summable()) {
    auto out = padded(gathered);
    ++phase_;
    return out;
  }
  // A two-round codec: the query from the first sum, and this rank's answer to it.
  const uint64_t values = codec_->reply_size(MessageKind::Query);
  if (failed_ && values) {
    // The others learn of the failure only at finish() (their checks are deferred): join their
    // second sum, with NaN.
    const auto scope = device_.activate();
    ops::scale(device_, rooms_.answer, std::numeric_limits<float>::quiet_NaN());
    ++phase_;
    return {sum_request(1, MessageKind::Answer)};
  }
  add_sum(rooms_.payload.first(sum_size_));
  Message query;
  reply(MessageKind::Query, query_, query);
  if (values) {
    // The aggregator's reply, checked at finish() before anything changes state.
    const auto scope = device_.activate();
    summable_->answer_deferred(query_.span().first(values), rooms_.answer);
  } else
    codec_->answer_sum(query.bytes(), rooms_.answer);
  ++phase_;
  return {sum_request(1, MessageKind::Answer)};
}

std::vector<Round::Request> Round::padded(std::span<const std::span<const uint8_t>> lengths) {
  SKETCHSGD_REQUIRE(lengths.size() == world_, InvalidArgument, "round: ", lengths.size(),
                    " lengths gathered in a group of ", world_);
  rethrow_own();
  const uint64_t limit = message_limit();
  sizes_.assign(world_, 0);
  uint64_t longest = 0;
  for (uint32_t r = 0; r < world_; ++r) {
    SKETCHSGD_REQUIRE(lengths[r].size() == sizeof(length_), WireError, "rank ", r,
                      " sent a length of ", lengths[r].size(), " bytes");
    uint64_t n = 0;
    for (size_t b = sizeof(length_); b-- > 0;) n = (n << 8) | lengths[r][b];
    SKETCHSGD_REQUIRE(n != 0, NonFiniteError, "rank ", r,
                      "'s gradient was not finite (that rank raised NonFiniteError with the "
                      "coordinate); this step has no update");
    SKETCHSGD_REQUIRE(n <= limit, WireError, "rank ", r, " sent a message of ", n, " bytes (limit ",
                      limit, ")");
    sizes_[r] = n;
    longest = std::max(longest, n);
  }
  // Every message padded to the longest of this step, not to the codec's worst case.
  const auto mine = message_.bytes();
  padded_.assign(longest, 0);
  std::copy(mine.begin(), mine.end(), padded_.begin());
  std::vector<Request> out{Request::gather(padded_)};
  if (whole_) out.push_back(Request::sum(0, WireFloat::F32));
  return out;
}

void Round::finish(std::span<const std::span<const uint8_t>> gathered, std::span<float> buffer,
                   Runs at) {
  finish_into(gathered, {}, buffer, 0, buffer.size(), at, false);
}

void Round::finish(std::span<const std::span<const uint8_t>> gathered, std::span<float> out,
                   uint64_t lo, uint64_t n, Runs at) {
  finish_into(gathered, {}, out, lo, n, at, true);
}

void Round::finish_update(std::span<const uint8_t> update, std::span<float> buffer, Runs at) {
  SKETCHSGD_REQUIRE(gathered(), ProtocolError,
                    "round: finish_update() of a round that gathers no messages");
  SKETCHSGD_REQUIRE(!update.empty(), WireError, "round: an update of 0 bytes");
  finish_into({}, update, buffer, 0, buffer.size(), at, false);
}

Message Round::reduce(std::span<const std::span<const uint8_t>> gathered) {
  SKETCHSGD_REQUIRE(this->gathered(), ProtocolError,
                    "round: reduce() of a round that gathers no messages");
  SKETCHSGD_REQUIRE(phase_ + 1 == phases(), ProtocolError, "round: reduce() before the last phase");
  SKETCHSGD_REQUIRE(gathered.size() == world_, InvalidArgument, "round: ", gathered.size(),
                    " messages gathered in a group of ", world_);
  rethrow_own();
  const auto scope = device_.activate();
  for (uint32_t r = 0; r < world_; ++r) {
    SKETCHSGD_REQUIRE(gathered[r].size() >= sizes_[r], WireError, "rank ", r,
                      "'s message: ", gathered[r].size(), " bytes gathered of ", sizes_[r]);
    aggregator_->add(gathered[r].first(sizes_[r]));
  }
  return aggregator_->finish();
}

void Round::finish_into(std::span<const std::span<const uint8_t>> gathered,
                        std::span<const uint8_t> update, std::span<float> out, uint64_t lo,
                        uint64_t n, Runs at, bool streamed) {
  SKETCHSGD_REQUIRE(phase_ + 1 == phases(), ProtocolError, "round: finish() before the last phase");
  SKETCHSGD_REQUIRE(lo <= n && out.size() <= n - lo, InvalidArgument, "round: values [", lo, ", +",
                    out.size(), ") of a buffer of ", n);
  require(out, out.size(), "buffer");
  require(at.whole, n, whole_, "whole");
  require(at.kept, n, codec_ ? codec_->dim() : 0, "compressed");
  const auto scope = device_.activate();
  const std::span<float> payload = rooms_.payload;
  if (!codec_) {
    rethrow_own();
    if (std::isnan(ops::value_at(device_, std::span<const float>(payload), 0)))
      throw NonFiniteError(
          "another rank's gradient was not finite (that rank raised NonFiniteError with the "
          "coordinate); this step has no update");
    mean_into(payload, out, lo, at.whole);
    return;
  }
  const uint64_t dim = codec_->dim(), hi = lo + out.size();
  // The compressed tensors as one run of the buffer: the codec writes its step, or the part of
  // it in out, straight there. Otherwise the whole step into a room, then the runs' parts in out.
  const bool one = at.kept.size() == 1;
  const uint64_t k0 = one ? at.kept[0].offset : 0;
  const uint64_t from = one ? std::clamp(k0, lo, hi) : lo,
                 to = one ? std::clamp(k0 + dim, lo, hi) : lo;
  auto room = [&] {
    if (step_.size() != dim) step_ = Buffer<float>(dim, device_);
    return step_.span();
  };
  // The whole step where the run lies inside out, else the room's (nothing written: empty).
  std::span<float> whole_step =
      one && from == k0 && to == k0 + dim ? out.subspan(k0 - lo, dim) : std::span<float>();
  if (summable() && dense_) {
    // The dense aggregator's update is the sum times float32(1/W), and applying it changes no
    // state: the same straight from the sum into the buffer, without the aggregator's passes
    // (finite check, sum, reply) and the apply's copy.
    check_sum();
    mean_into(payload.first(sum_size_), out, lo, at.kept);
  } else {
    bool written = false;  // the step's part in out already
    if (summable()) {
      add_sum(codec_->two_rounds() ? rooms_.answer : payload.first(sum_size_));
      Message update;
      reply(MessageKind::Update, update_, update);
      if (const uint64_t values = codec_->reply_size(MessageKind::Update)) {
        settle();
        // One run: only its part in out computed.
        if (one) {
          summable_->apply_settled(update_.span().first(values), out.subspan(from - lo, to - from),
                                   {to > from ? from - k0 : 0, streamed});
          written = true;
        } else
          summable_->apply_settled(update_.span().first(values), room(), {});
      } else {
        if (whole_step.empty()) whole_step = room();
        codec_->apply(update.bytes(), whole_step);
      }
    } else if (sparse_) {
      rethrow_own();
      const payload::Sparse list = sparse_->update(gathered);
      const Header h{codec_->id(), MessageKind::Update, dim, round_, kServerRank, 0};
      const Message reduced =
          payload::sparse_update(h, list.indices, list.values, sparse_->format());
      if (whole_step.empty()) whole_step = room();
      codec_->apply(reduced.bytes(), whole_step);
      sparse_->settle(list);
    } else {
      rethrow_own();
      Message reduced;
      if (update.empty()) {
        reduced = reduce(gathered);
        update = reduced.bytes();
      }
      if (whole_step.empty()) whole_step = room();
      codec_->apply(update, whole_step);
    }
    if (!written && (whole_step.empty() || whole_step.data() == step_.data()))
      ops::scale_pieces(device_, pieces(out, lo, at.kept, step_.data(), true), 1.0f);
  }
  mean_into(payload.subspan(sum_size_), out, lo, at.whole);
}

std::vector<Round::Request> Round::next_sparse(std::span<const std::span<const uint8_t>> gathered) {
  const std::span<float> counts = rooms_.payload.subspan(whole_, sparse::kBuckets);
  switch (phase_) {
    case 0:
      rethrow_own();
      return {Request::exchange(sparse_->parts(gathered))};
    case 1: {
      std::vector<float> host(sparse::kBuckets);
      sparse_->receive(gathered, host);
      ops::copy_across(Device::cpu(), device_, counts.data(), host.data(), host.size());
      return {Request::sum(0, WireFloat::F32)};  // the tensors sent whole beside the counts
    }
    case 2: {
      std::vector<float> staging, fine(sparse::kBuckets);
      sparse_->counted(ops::to_host(device_, counts, staging), fine);
      ops::copy_across(Device::cpu(), device_, counts.data(), fine.data(), fine.size());
      return {Request::sum(0, WireFloat::F32, 1, whole_, sparse::kBuckets)};
    }
    case 3: {
      std::vector<float> staging;
      return {Request::gather(sparse_->refined(ops::to_host(device_, counts, staging)))};
    }
    default:
      return {Request::gather(sparse_->padded(gathered))};
  }
}

void Round::mean_into(std::span<const float> sum, std::span<float> out, uint64_t lo,
                      std::span<const Layout::Run> runs) const {
  ops::scale_pieces(device_, pieces(out, lo, runs, sum.data(), true), inv_);
}

uint64_t Round::message_limit() const {
  SKETCHSGD_REQUIRE(gathered(), ProtocolError,
                    "round: message_limit() of a round that gathers no messages");
  return kHeaderBytes + codec_->max_payload(MessageKind::Gradient);
}

void Round::rethrow_own() const {
  if (failed_) std::rethrow_exception(failed_);
}

std::exception_ptr Round::check_whole(std::span<const float> whole,
                                      std::span<const Layout::Run> runs) {
  if (whole.empty()) return nullptr;
  size_t bad = ops::find_nonfinite(device_, scratch_, whole);
  if (bad == kernels::kNone) return nullptr;
  const float value = ops::value_at(device_, whole, bad);
  for (const auto& run : runs) {  // the position in the buffer
    if (bad < run.numel) {
      bad += run.offset;
      break;
    }
    bad -= run.numel;
  }
  std::ostringstream os;
  os << "round: non-finite value " << value << " at coordinate " << bad << " (a tensor sent whole)";
  return std::make_exception_ptr(NonFiniteError(os.str()));
}

void Round::check_sum() const {
  rethrow_own();
  if (sum_size_ && std::isnan(ops::value_at(device_, std::span<const float>(rooms_.payload), 0)))
    throw NonFiniteError(
        "another rank's gradient was not finite (that rank raised NonFiniteError with the "
        "coordinate); this step has no update");
}

template <class F>
void Round::attributed(F&& f) {
  try {
    f();
  } catch (const WireError&) {
    // The aggregator refuses a sum that is not finite: say whose fault it was when a rank
    // signalled it (reading the payload, a host synchronisation, only now).
    check_sum();
    throw;
  }
}

void Round::add_sum(std::span<const float> sum) {
  rethrow_own();
  attributed([&] {
    const auto deferred = summed_->defer_checks();
    summed_->add_sum(sum, world_, round_);
  });
}

void Round::reply(MessageKind kind, Buffer<float>& room, Message& message) {
  attributed([&] {  // a message's reduce() settles the checks first
    const auto deferred = summed_->defer_checks();
    if (const uint64_t n = codec_->reply_size(kind)) {
      if (room.size() != n) room = Buffer<float>(n, device_);
      summed_->finish_values(room.span());
    } else {
      message = summed_->finish();
    }
  });
}

void Round::settle() {
  attributed([&] { summed_->settle_checks(true); });
}

}  // namespace sketchsgd
