#include <sketchsgd/server/rounds.hpp>

#include <algorithm>
#include <sstream>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {
namespace {

std::string ranks_text(const std::vector<uint32_t>& r) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < r.size(); ++i) os << (i ? "," : "") << r[i];
  os << ']';
  return os.str();
}

}  // namespace

using Worker = Roster::Worker;

Rounds::Rounds(const Parts& parts) : PushHandle(parts) {
  reset();
}

void Rounds::start_phase(MessageKind kind) {
  phase_ = kind;
  held_.assign(cfg_.world, Frame());
  cursor_ = 0;
}

void Rounds::absorb_in_order(bool closing) {
  const bool gradient = phase_ == MessageKind::Gradient;
  auto& got = gradient ? pushed_ : answered_;
  SKETCHSGD_ASSERT(held_.size() == cfg_.world && cursor_ <= cfg_.world, "held ", held_.size(),
                   ", cursor ", cursor_, ", world ", cfg_.world);
  for (; cursor_ < cfg_.world; ++cursor_) {
    const uint32_t r = cursor_;
    if (held_[r].size() == 0) {
      const bool expected = gradient || pushed_[r];
      if (expected && !closing) return;
      continue;
    }
    const auto t0 = Clock::now();
    try {
      store_.aggregator().add(held_[r].bytes());
    } catch (const Error& e) {
      got[r] = false;  // a corrupt message does not count as a contribution
      replies_.drop("rank " + std::to_string(r) + ": " + e.what());
    }
    merge_ms_ += ms_between(t0, Clock::now());
    held_[r] = Frame();
  }
}

void Rounds::reset() {
  if (std::find(pushed_.begin(), pushed_.end(), true) != pushed_.end()) last_pushed_ = pushed_;
  pushed_.assign(cfg_.world, false);
  answered_.assign(cfg_.world, false);
  query_ = Frame();
  start_phase(MessageKind::Gradient);
  round_start_.reset();
  metrics_ = RoundMetrics{};
  metrics_.bytes_up.assign(cfg_.world, 0);
  metrics_.dense_bytes = cfg_.dim * 4 + kHeaderBytes;
  merge_ms_ = 0;
  if (federated()) roster_.sample(store_.round());
}

void Rounds::push(uint32_t rank, const Envelope& e, const Frames& f, Clock::time_point now,
                  std::vector<Outgoing>& out) {
  if (e.round < store_.round()) {
    // Idempotent: a worker that missed the outcome of the previous round gets it again; older
    // pushes are ignored.
    if (e.round + 1 == store_.round() && !store_.last_outcome().empty()) {
      replies_.resend(rank, store_.last_outcome(), e.round, out);
    } else {
      pull_(rank, out);  // further behind (outcomes lost): resynchronise with the model
    }
    hooks_.log("stale push of round " + std::to_string(e.round) + " from rank " +
               std::to_string(rank) + " (now at " + std::to_string(store_.round()) + ")");
    return;
  }
  if (store_.finished()) return replies_.finished(roster_[rank].peer, e, out);
  if (e.round > store_.round() && e.round <= store_.round() + cfg_.staleness()) {
    const auto msg = f[1].bytes();
    SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "push of rank ", rank, " round ",
                      e.round, " carries a message with another sender or round");
    auto& slot = early_[e.round];
    slot.resize(cfg_.world);
    SKETCHSGD_REQUIRE(slot[rank].size() == 0, ProtocolError, "duplicate push from rank ", rank,
                      " for round ", e.round);
    slot[rank] = f[1];  // merged when its round starts
    return;
  }
  if (e.round > store_.round()) {
    // Only after a server restart from an older checkpoint: resynchronise the worker.
    hooks_.log("rank " + std::to_string(rank) + " pushed round " + std::to_string(e.round) +
               " ahead of the server's " + std::to_string(store_.round()) + ": sending the model");
    pull_(rank, out);
    return;
  }
  if (phase_ == MessageKind::Answer && pushed_[rank] && !answered_[rank]) {
    // A queried rank that pushes its round again has registered again: the Query went to its
    // old connection and was lost (or its Answer was). It is asked again (an answer changes no
    // state of the worker's codec, so a second one is harmless); else the round would wait for
    // an answer that never comes (a chaos soak's stalled two-round jobs).
    replies_.send(rank, {replies_.to(rank, Type::Query, store_.round()), query_}, out);
    return;
  }
  SKETCHSGD_REQUIRE(phase_ == MessageKind::Gradient, ProtocolError, "late push from rank ", rank,
                    ": round ", store_.round(), " is in its second phase");
  const auto msg = f[1].bytes();
  SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "push of rank ", rank, " round ",
                    e.round, " carries a message with another sender or round");
  SKETCHSGD_REQUIRE(!pushed_[rank], ProtocolError, "duplicate push from rank ", rank, " in round ",
                    e.round);
  // Ranks below the cursor are merged or skipped already (e.g. a corrupt push was dropped).
  SKETCHSGD_REQUIRE(rank >= cursor_, ProtocolError, "push from rank ", rank, " in round ", e.round,
                    " arrived after its turn to merge");
  if (!round_start_) round_start_ = now;
  if (std::none_of(pushed_.begin(), pushed_.end(), [](bool b) { return b; })) phase_start_ = now;
  pushed_[rank] = true;
  held_[rank] = f[1];
  metrics_.bytes_up[rank] += msg.size();
  absorb_in_order(false);
}

void Rounds::answer(uint32_t rank, const Envelope& e, const Frames& f) {
  if (e.round < store_.round()) return;  // answer of a round that already closed: nothing to do
  SKETCHSGD_REQUIRE(e.round == store_.round() && phase_ == MessageKind::Answer, ProtocolError,
                    "answer of round ", e.round, " from rank ", rank,
                    " while no query of that round is open");
  SKETCHSGD_REQUIRE(pushed_[rank], ProtocolError, "answer from rank ", rank,
                    " which was not queried");
  const auto msg = f[1].bytes();
  SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "answer of rank ", rank,
                    " carries a message with another sender or round");
  SKETCHSGD_REQUIRE(!answered_[rank], ProtocolError, "duplicate answer from rank ", rank);
  SKETCHSGD_REQUIRE(rank >= cursor_, ProtocolError, "answer from rank ", rank,
                    " arrived after its turn to merge");
  answered_[rank] = true;
  held_[rank] = f[1];
  metrics_.bytes_up[rank] += msg.size();
  absorb_in_order(false);
}

// ---- rounds
// ---------------------------------------------------------------------------------------

void Rounds::progress(Clock::time_point now, std::vector<Outgoing>& out) {
  for (uint32_t n = 0; n <= cfg_.staleness() && progress_once(now, out); ++n) {
  }
}

void Rounds::replay_held(Clock::time_point now) {
  const auto it = early_.find(store_.round());
  if (it == early_.end()) return;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    if (it->second[r].size() == 0) continue;
    if (!round_start_) round_start_ = phase_start_ = now;
    pushed_[r] = true;
    metrics_.bytes_up[r] += it->second[r].size();
    held_[r] = std::move(it->second[r]);
  }
  early_.erase(early_.begin(), std::next(it));
  absorb_in_order(false);
}

bool Rounds::progress_once(Clock::time_point now, std::vector<Outgoing>& out) {
  const uint64_t before = store_.round();
  const MessageKind phase = phase_;
  if (!store_.has_model() || store_.finished()) return false;
  const bool gradient = phase_ == MessageKind::Gradient;
  const auto& got = gradient ? pushed_ : answered_;
  const uint32_t count = uint32_t(std::count(got.begin(), got.end(), true));
  const bool late = now - phase_start_ >= cfg_.deadline;
  if (count == 0) {
    if (gradient) {
      // No deadline before the first push, except in a federated round that no live client holds
      // a slot of: its clients come for it alone, and after a restart from an older checkpoint
      // they may all have been and gone. (A registered client may train for longer than a
      // deadline: the round's counts from its first push.) Counted from when the round was first
      // seen so; aborted a deadline later.
      if (!federated() || cfg_.policy() == Policy::Wait) return false;
      if (roster_.live() > 0) {
        empty_since_.reset();
        return false;
      }
      if (!empty_since_ || empty_since_->first != store_.round())
        empty_since_.emplace(store_.round(), now);
      if (now - empty_since_->second < cfg_.deadline) return false;
      abort_round(now, out, "no client of the round pushed or stayed live for a deadline");
      return true;
    }
    // A second phase nobody can answer any more (the queried workers died or were dropped).
    bool live = false;
    for (uint32_t r = 0; r < cfg_.world; ++r)
      live |= pushed_[r] && roster_[r].registered && roster_[r].alive;
    if (live && now - phase_start_ < cfg_.deadline) return false;
    abort_round(now, out, "no answer to the query arrived");
    return true;
  }
  bool all = true, live_all = true;
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    const bool expected = gradient || pushed_[r];
    if (!expected || got[r]) continue;
    all = false;
    missing.push_back(r);
    // Still to come: a live worker, or a federated client that has not registered yet (one
    // that registered and then fell silent or left is gone, like a dead worker).
    const Worker& w = roster_[r];
    if (federated() ? !(w.registered && !w.alive) : w.registered && w.alive) live_all = false;
  }
  if (all) {
    close_phase(now, out, "");
    return store_.round() != before || phase_ != phase;
  }
  if (!gradient) {
    // The answers of dead workers never come, whatever the policy.
    if (live_all || late) close_phase(now, out, "no answer from " + ranks_text(missing));
    return store_.round() != before;
  }
  switch (cfg_.policy()) {
    case Policy::Quorum:
      if (count >= cfg_.min_workers() && (live_all || late)) {
        close_phase(now, out,
                    "quorum of " + std::to_string(count) + ", missing " + ranks_text(missing));
        return store_.round() != before || phase_ != phase;
      }
      // A federated round's clients come for it alone: those missing at the deadline are not
      // coming back (the next round's are sampled already, and would wait for ever behind it).
      if (federated() && late) {
        abort_round(now, out,
                    "deadline passed with " + std::to_string(count) + " of " +
                        std::to_string(cfg_.world) + " pushes, short of the quorum of " +
                        std::to_string(cfg_.min_workers()) + ", missing " + ranks_text(missing));
        return true;
      }
      break;
    case Policy::Abort:
      if (late) {
        abort_round(now, out,
                    "deadline passed with " + std::to_string(count) + " of " +
                        std::to_string(cfg_.world) + " pushes, missing " + ranks_text(missing));
        return true;
      }
      break;
    case Policy::Wait:
      break;
  }
  if (late && now - last_wait_log_ >= cfg_.deadline) {
    last_wait_log_ = now;
    hooks_.log("round " + std::to_string(store_.round()) + " past its deadline, waiting for " +
               ranks_text(missing));
  }
  return false;
}

void Rounds::close_phase(Clock::time_point now, std::vector<Outgoing>& out, std::string reason) {
  absorb_in_order(true);
  const uint32_t count = store_.aggregator().count();
  if (count == 0)  // every held message was corrupt, and nobody will send it again
    return abort_round(now, out, "every message of the phase was invalid");
  const auto t0 = Clock::now();
  Message m;
  try {
    m = store_.aggregator().finish();
  } catch (const Error& e) {  // e.g. the sum overflowed to ±Inf: skip the round, keep serving
    return abort_round(now, out, std::string("reduce failed: ") + e.what());
  }
  merge_ms_ += ms_between(t0, Clock::now());
  if (!reason.empty()) metrics_.reason += (metrics_.reason.empty() ? "" : "; ") + reason;
  const Frame payload = Frame::own(std::move(m).release());

  if (store_.aggregator().expecting() == MessageKind::Answer) {
    start_phase(MessageKind::Answer);
    phase_start_ = now;
    query_ = payload;
    metrics_.contributors = count;
    metrics_.bytes_down_each += payload.size();
    for (uint32_t r = 0; r < cfg_.world; ++r)
      if (pushed_[r]) replies_.send(r, {replies_.to(r, Type::Query, store_.round()), payload}, out);
    return;
  }
  if (phase_ == MessageKind::Gradient) metrics_.contributors = count;

  const UpdateInfo info{cfg_.lr, metrics_.contributors};
  try {
    store_.apply(payload.bytes(), cfg_.lr);
  } catch (const Error& e) {
    return abort_round(now, out, std::string("update rejected: ") + e.what());
  }
  metrics_.bytes_down_each += payload.size();
  end_round(Type::Update, {Frame::own(encode(info)), payload}, now, out);
}

void Rounds::end_round(Type outcome, Frames payload, Clock::time_point now,
                       std::vector<Outgoing>& out) {
  const uint64_t round = store_.round();
  Frames kept{envelope(outcome, cfg_.job, round, 0, 0)};
  kept.insert(kept.end(), payload.begin(), payload.end());
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    if (!roster_[r].registered) continue;  // "dead" ones too: they may only be slow
    Frames fr = kept;
    fr[0] = replies_.to(r, outcome, round);
    replies_.send(r, std::move(fr), out);
  }
  metrics_.latency_ms = round_start_ ? ms_between(*round_start_, now) : 0;
  report_round();
  commit_(std::move(kept), out);
  replay_held(now);
}

void Rounds::abort_round(Clock::time_point now, std::vector<Outgoing>& out, std::string reason) {
  hooks_.log("round " + std::to_string(store_.round()) + " aborted: " + reason);
  store_.aggregator().abandon();  // drop the partial merge, keep state across rounds (FetchSGD)
  metrics_.aborted = true;
  metrics_.reason = reason;
  end_round(Type::Abort, {Frame::own(encode_text(reason.substr(0, kMaxText)))}, now, out);
}

void Rounds::report_round() {
  metrics_.round = store_.round();
  metrics_.merge_ms = merge_ms_;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    const Worker& w = roster_[r];
    if (w.registered && w.alive && !pushed_[r]) metrics_.stragglers.push_back(r);
    if (!w.registered || !w.alive) metrics_.dead.push_back(r);
  }
  if (!metrics_.aborted && !metrics_.stragglers.empty())
    hooks_.log("round " + std::to_string(store_.round()) + " closed without " +
               ranks_text(metrics_.stragglers) + (metrics_.reason.empty() ? "" : ": ") +
               metrics_.reason);
  hooks_.round(metrics_);
}

std::optional<Clock::time_point> Rounds::deadline() const {
  if (!store_.has_model() || store_.finished() || cfg_.policy() == Policy::Wait)
    return std::nullopt;
  const bool running = phase_ == MessageKind::Answer ||
                       std::any_of(pushed_.begin(), pushed_.end(), [](bool b) { return b; });
  if (!running) return std::nullopt;
  return phase_start_ + cfg_.deadline;
}

void Rounds::restart() {
  early_.clear();
  reset();
}

bool Rounds::pushed_last(uint32_t rank) const {
  return !federated() && rank < last_pushed_.size() && last_pushed_[rank];
}

}  // namespace sketchsgd::ps
