#include <sketchsgd/server/engine.hpp>

#include <sketchsgd/server/async_pushes.hpp>
#include <sketchsgd/server/rounds.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::ps {

Engine::Engine(JobConfig cfg, Hooks hooks)
    : cfg_(cfg.checked()),
      hooks_(std::move(hooks)),
      store_(cfg_, hooks_.checkpoint),
      replies_(cfg_.job, roster_, store_, hooks_.log),
      admission_(cfg_, roster_, store_, replies_, hooks_.log) {
  cfg_.spec = store_.spec();
  SKETCHSGD_REQUIRE(cfg_.staleness() == 0 || !store_.codec().two_rounds(), InvalidArgument,
                    "bounded staleness needs a one-round codec: ", cfg_.spec,
                    " queries worker state that has moved on");
  SKETCHSGD_REQUIRE(!cfg_.async() || !store_.codec().two_rounds(), InvalidArgument,
                    "an asynchronous job needs a one-round codec: ", cfg_.spec,
                    " queries its workers in a second round");
  roster_ = Roster(cfg_.world, cfg_.population(), cfg_.sample_seed());
  pending_pull_.assign(cfg_.world, false);
  const Parts parts{
      cfg_,
      hooks_,
      store_,
      roster_,
      replies_,
      [this](uint32_t rank, std::vector<Outgoing>& out) { on_pull(rank, out); },
      [this](Frames outcome, std::vector<Outgoing>& out) { commit(std::move(outcome), out); }};
  if (cfg_.async())
    handle_ = std::make_unique<AsyncPushes>(parts);
  else
    handle_ = std::make_unique<Rounds>(parts);
}

uint64_t Engine::max_frame_bytes() const {
  return ps::max_frame_bytes(store_.codec());
}

uint32_t Engine::live_workers() const {
  return roster_.live();
}

uint32_t Engine::awaited_workers() const {
  uint32_t n = 0;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    const Worker& w = roster_[r];
    n += w.registered && !w.left && (w.alive || handle_->pushed_last(r));
  }
  return n;
}

void Engine::restore(const Checkpoint& c) {
  store_.restore(c);
  roster_.forget_waiting();  // check-ins were for the round the server was at
  // Asynchronous jobs: the pushes numbered by an earlier state may be lost; each worker's next
  // Hello says where it is.
  for (Worker& w : roster_.workers()) w.numbered = false;
  handle_->restart();
}

std::vector<uint64_t> Engine::next_pushes() const {
  std::vector<uint64_t> v;
  if (!cfg_.async()) return v;
  for (uint32_t r = 0; r < cfg_.world; ++r) v.push_back(next_push(r).value_or(kUnknownPush));
  return v;
}

void Engine::resume(const std::vector<Bytes>& outcome, const std::vector<uint64_t>& pushes) {
  Frames f;
  if (!outcome.empty()) {
    const Envelope e = decode_envelope(outcome[0], outcome.size() - 1);
    SKETCHSGD_REQUIRE((e.type == Type::Update || e.type == Type::Abort) && store_.round() > 0 &&
                          e.round == store_.round() - 1 && e.job == cfg_.job,
                      WireError, "resume: an outcome (", to_string(e.type), " of round ", e.round,
                      ") that is not round ", store_.round(), " - 1's");
    for (const Bytes& b : outcome) f.push_back(Frame::own(b));
  }
  SKETCHSGD_REQUIRE(pushes.empty() || (cfg_.async() && pushes.size() == cfg_.world), WireError,
                    "resume: ", pushes.size(), " push numbers for a job of ", cfg_.world,
                    cfg_.async() ? " workers" : " workers in rounds");
  store_.set_last_outcome(std::move(f));
  for (uint32_t r = 0; r < pushes.size(); ++r) {
    if (pushes[r] == kUnknownPush) continue;
    roster_[r].numbered = true;
    roster_[r].next_push = pushes[r];
  }
}

void Engine::seat_waiting(std::vector<Outgoing>& out) {
  for (const auto& [r, behind] : roster_.seat_waiting()) {
    if (behind)  // as a fixed worker gets it
      replies_.resend(r, store_.last_outcome(), store_.round() - 1, out);
    else
      on_pull(r, out);
  }
}

void Engine::handle(const PeerId& peer, const Frames& frames, Clock::time_point now,
                    std::vector<Outgoing>& out, std::string_view user) {
  try {
    SKETCHSGD_REQUIRE(!frames.empty(), WireError, "message without frames");
    refuse_other_version(peer, frames, out);
    const Envelope e = decode_envelope(frames[0].bytes(), frames.size() - 1);
    if (e.job != cfg_.job) {
      if (e.type == Type::Hello)
        replies_.refuse(
            peer, e, false,
            "job id " + std::to_string(e.job) + ", server runs job " + std::to_string(cfg_.job),
            out);
      else
        replies_.drop("job id " + std::to_string(e.job) + " is not this job's");
      return;
    }
    if (e.type == Type::Hello) {
      // Also after the last round: a late worker may still pull the final model; its first push
      // is answered Finished.
      if (const auto rank = admission_.hello(peer, e, frames, now, epoch_, user, out))
        on_pull(*rank, out);
      return;
    }
    const auto held = roster_.rank_of(peer);
    if (!held) {
      if (const auto slot = roster_.waiting_slot(peer)) return admission_.waiting(*slot, e, now);
      if (e.type == Type::Bye) return;
      if (finished() && e.type == Type::Push) return replies_.finished(peer, e, out);
      // A worker whose server restarted learns here that it must register again.
      replies_.refuse(peer, e, true, "not registered (send hello first)", out);
      return;
    }
    const uint32_t rank = *held;
    SKETCHSGD_REQUIRE(e.rank == rank, ProtocolError, "connection of rank ", rank,
                      " sent a message as rank ", e.rank);
    Worker& w = roster_[rank];
    if (e.session != w.session) {
      // Only this registration's token counts: a capture replayed from this connection after a
      // re-registration, or traffic of an older registration, changes nothing. (A heartbeat sent
      // while a re-registration crossed it is no replay: ignored, not counted.)
      if (e.type == Type::Heartbeat) return;
      replies_.replay("rank " + std::to_string(rank) + ": session token of another registration");
      return;
    }
    w.last_seen = now;
    if (!w.alive) {
      w.alive = true;
      hooks_.log("rank " + std::to_string(rank) + " is alive again");
    }
    switch (e.type) {
      case Type::Init:
        on_init(rank, e.round, frames, out);
        break;
      case Type::Pull:
        on_pull(rank, out);
        break;
      case Type::Push:
        SKETCHSGD_REQUIRE(has_model(), ProtocolError, "push from rank ", rank,
                          " before the model exists");
        handle_->push(rank, e, frames, now, out);
        break;
      case Type::Answer:
        handle_->answer(rank, e, frames);
        break;
      case Type::Heartbeat:
        break;  // liveness noted above; the transport echoes it
      case Type::Bye:
        w.alive = false;
        w.left = true;
        hooks_.log("rank " + std::to_string(rank) + " left");
        break;
      default:
        throw ProtocolError(std::string(to_string(e.type)) + " is a server-to-worker message");
    }
    handle_->progress(now, out);
  } catch (const Error& ex) {
    replies_.drop(ex.what());
  }
}

void Engine::refuse_other_version(const PeerId& peer, const Frames& frames,
                                  std::vector<Outgoing>& out) {
  // A Hello of another protocol version gets a reason (in this version's format, which keeps the
  // magic and the version field where they are) instead of silence.
  const auto hello = peek_foreign_hello(frames[0].bytes());
  if (!hello) return;
  Envelope e{Type::Hello, cfg_.job, 0, hello->rank, 0};
  replies_.refuse(peer, e, false,
                  "protocol version " + std::to_string(hello->version) + ", this server speaks " +
                      std::to_string(kProtocolVersion),
                  out);
}

void Engine::on_init(uint32_t rank, uint64_t round, const Frames& f, std::vector<Outgoing>& out) {
  SKETCHSGD_REQUIRE(rank == 0 || federated(), ProtocolError, "init from rank ", rank,
                    " (only rank 0 initialises)");
  if (has_model())
    return;  // a second init (rank 0 restarted before the first pull) changes nothing
  // A server restarted without a checkpoint gets rank 0's current model: the job goes on from
  // rank 0's round, not from round 0 again (which would run the rounds before it twice).
  // (An asynchronous worker's round counts its own pushes; a federated client's is its round.)
  const bool later =
      !cfg_.async() && !federated() && round > store_.round() && !handle_->holds_later_pushes();
  store_.init(f[1].bytes(), later ? round : 0);
  if (later)
    hooks_.log("model initialised by rank 0 at its round " + std::to_string(store_.round()) + " (" +
               std::to_string(cfg_.dim) + " parameters)");
  else
    hooks_.log("model initialised by rank 0 (" + std::to_string(cfg_.dim) + " parameters)");
  // The initial model is checkpointed as a round's end is: a server killed before its first
  // round ended restarts with it rather than wait for an Init (a federated job's next clients
  // hold none).
  store_.save_now();
  for (uint32_t r = 0; r < cfg_.world; ++r)
    if (pending_pull_[r]) on_pull(r, out);
}

void Engine::on_pull(uint32_t rank, std::vector<Outgoing>& out) {
  if (!has_model()) {
    pending_pull_[rank] = true;
    return;
  }
  pending_pull_[rank] = false;
  Frames fr = store_.model_frames();
  if (cfg_.async()) {
    // Its pushes from now on are computed on this version (its own updates counted apart).
    Worker& w = roster_[rank];
    w.base = store_.round();
    w.own = 0;
    fr[0] = replies_.to(rank, Type::Model, w.next_push);
  } else {
    fr[0] = replies_.to(rank, Type::Model, store_.round());
  }
  replies_.send(rank, std::move(fr), out);
}

void Engine::follow(uint64_t round, const CommitInfo& c, std::span<const uint8_t> payload) {
  SKETCHSGD_REQUIRE(has_model(), ProtocolError, "commit of round ", round, " before any state");
  SKETCHSGD_REQUIRE(round == store_.round(), ProtocolError, "commit of round ", round, " at round ",
                    store_.round());
  const bool update = c.outcome == Type::Update;
  store_.follow(c.codec_state, update ? &payload : nullptr, c.info.lr);  // all or nothing
  Frames outcome{envelope(c.outcome, cfg_.job, round, 0, 0)};
  if (update) outcome.push_back(Frame::own(encode(c.info)));
  outcome.push_back(Frame::own(Bytes(payload.begin(), payload.end())));
  handle_->followed(c, outcome);
  store_.commit(std::move(outcome));  // a backup's: nobody observes it
  handle_->reset();
}

void Engine::commit(Frames outcome, std::vector<Outgoing>& out) {
  if (ended_) ended_(store_.round(), outcome);
  if (federated()) {  // its clients leave: every slot waits for the next sample
    roster_.release();
    pending_pull_.assign(cfg_.world, false);
  }
  store_.commit(std::move(outcome));
  handle_->reset();
  if (federated() && !finished()) seat_waiting(out);
}

std::optional<Clock::time_point> Engine::deadline() const {
  return handle_->deadline();
}

void Engine::tick(Clock::time_point now, std::vector<Outgoing>& out) {
  const auto limit = cfg_.heartbeat * cfg_.dead_after;
  for (uint32_t r = 0; r < cfg_.world; ++r) {
    Worker& w = roster_[r];
    if (w.registered && w.alive && now - w.last_seen > limit) {
      w.alive = false;
      hooks_.log("rank " + std::to_string(r) + " is dead: silent for " +
                 std::to_string(int64_t(ms_between(w.last_seen, now))) + " ms");
    }
  }
  handle_->progress(now, out);
}

}  // namespace sketchsgd::ps
