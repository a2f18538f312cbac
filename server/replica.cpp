#include <sketchsgd/server/replica.hpp>

namespace sketchsgd::ps {

namespace {
bool is(const Frames& frames, Type t) {
  try {
    return decode_envelope(frames.at(0).bytes(), frames.size() - 1).type == t;
  } catch (const Error&) {
    return false;
  }
}

/// A worker's answer to a probe as the Hello it answers for: once this server serves, the worker
/// that answered waits for its Welcome.
Frames as_hello(const Frames& present) {
  Envelope e = decode_envelope(present.at(0).bytes(), present.size() - 1);
  e.type = Type::Hello;
  e.session = 0;
  return {Frame::own(encode(e)), present.at(1)};
}
}  // namespace

Replica::Replica(Engine& engine, ReplicaOptions opts, Log log)
    : engine_(engine), opts_(opts), log_(std::move(log)), primary_(engine, log_) {
  if (opts_.backup) backup_ = std::make_unique<Backup>(engine, log_);
}

void Replica::woke(Clock::time_point now) {
  const JobConfig& cfg = engine_.config();
  if (backup_ && ran_ && now - *ran_ > cfg.heartbeat * cfg.dead_after && following()) {
    log_("this server did not run for " +
         std::to_string(std::chrono::duration_cast<Millis>(now - *ran_).count()) +
         " ms: counting the workers that come from now on");
    backup_->heard(now);
  }
  if (!ran_) heard_ = now;
  ran_ = now;
}

void Replica::handle(const PeerId& peer, const Frames& frames, Clock::time_point now,
                     std::vector<Outgoing>& out, std::vector<Frames>& up, std::string_view user) {
  woke(now);
  if (following()) {
    heard_ = now;
    switch (backup_->consider(frames, now)) {
      case Backup::Verdict::Ignore:
        // Stay silent, so that the workers go on looking for the primary.
        if (ignored_++ % 100 == 0)
          log_("a backup not serving yet: ignored " + std::to_string(ignored_) +
               " worker messages");
        return;
      case Backup::Verdict::Behind:
        log_(
            "a worker holds rounds this backup never had (its primary went on without it): "
            "not taking over; asking the primary for its state again");
        up.push_back(backup_->unsync());
        out.push_back(Outgoing{peer, backup_->refusal(frames)});
        return;
      case Backup::Verdict::Probe:
        if (probes_++ % 100 == 0)
          log_(
              "the primary is silent: asking the workers that come whether they are still "
              "looking (" +
              std::to_string(probes_) + " probes)");
        out.push_back(Outgoing{peer, backup_->probe(frames, now)});
        return;
      case Backup::Verdict::Release:
        if (releases_++ % 100 == 0)
          log_(
              "a worker waits for this backup to take over while the primary is heard: "
              "releasing it (" +
              std::to_string(releases_) + " releases)");
        out.push_back(Outgoing{peer, backup_->release(frames)});
        return;
      case Backup::Verdict::TakeOver:
        up.push_back(backup_->promote());
        gathering_ = engine_.config().async();
        break;
    }
  } else if (backup_ && backup_->behind(frames)) {
    // Taken over, and a worker comes holding rounds its primary released after losing this
    // backup: those updates are nowhere here. Said loudly, not undone silently.
    log_("a worker holds rounds this server never had: the job's state is split");
    out.push_back(Outgoing{peer, backup_->refusal(frames)});
    return;
  }
  if (backup_ && is(frames, Type::Present)) {
    handle(peer, as_hello(frames), now, out, up, user);
    return;
  }
  if (gathering_ && is(frames, Type::Push)) {
    // Bounded: a worker has few pushes out, and one sent again replaces nothing here.
    if (waiting_.size() >= 8 * size_t(engine_.config().world)) waiting_.pop_front();
    waiting_.emplace_back(peer, frames);
    return;
  }
  primary_.handle(peer, frames, now, out, user);
  if (gathering_ && backup_->everyone_here()) {
    gathering_ = false;
    log_("every worker has registered since the takeover: applying their pushes");
    auto held = std::exchange(waiting_, {});
    for (auto& [p, f] : held) primary_.handle(p, f, now, out);
  }
}

void Replica::upstream(const Frames& frames, Clock::time_point now, std::vector<Frames>& up) {
  woke(now);
  if (!backup_) return;
  heard_ = now;
  backup_->heard(now);
  backup_->handle(frames, up);
}

Frames Replica::reconnected() {
  return backup_ ? backup_->reconnected() : Frames{};
}

Frames Replica::follow() const {
  return backup_ ? backup_->follow() : Frames{};
}

void Replica::tick(Clock::time_point now, std::vector<Outgoing>& out) {
  woke(now);
  primary_.tick(now, out);
}

bool Replica::done(Clock::time_point now) {
  if (following() && !engine_.finished() && now - heard_ >= 10 * opts_.finish_wait) {
    why_ = "neither the primary nor a worker said anything for " +
           std::to_string(std::chrono::duration_cast<Millis>(now - heard_).count()) +
           " ms: the job went on or ended without this backup";
    return true;
  }
  if (!engine_.finished()) return false;
  why_ = "the job is done";
  if (!finished_at_) finished_at_ = now;
  const auto since = now - *finished_at_;
  // A backup still following waits for its primary's goodbye: should the primary die before its
  // workers hold the last update, they come here for it. A serving server waits for its workers'
  // (each says Bye once it holds the last update, which on a slow link takes seconds to arrive
  // and is lost if the socket closes first), counting one that pushed the last round as coming
  // even once declared dead: a pause or a lost connection at the end (the chaos soak's job whose
  // primary, woken, ended the last round and stopped as its workers reconnected).
  const bool idle = following() ? backup_->primary_done() : engine_.awaited_workers() == 0;
  return since >= opts_.finish_grace && (idle || since >= opts_.finish_wait);
}

}  // namespace sketchsgd::ps
