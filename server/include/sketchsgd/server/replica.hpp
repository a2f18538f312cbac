// One server's roles, free of sockets and threads: every server is a Primary (any backup may
// follow it), and one started as a backup follows its primary (Backup) until a worker comes to
// it. What Server::run does with its two sockets, decided here: the ZeroMQ server (server.cpp)
// runs one over its sockets and threads, the simulator (tests/sim) many in one process.
//
// A following backup answers nothing on its own port but a Probe, so workers go on looking for the
// primary, until every worker has come with a Hello the job would accept while the primary has
// been silent to it too, and answered the Probe (Backup::consider): then it takes over (its Deposed
// notice goes up to the primary) and serves. A worker holding rounds the backup never had (the
// primary lost it and went on alone) is sent back to the primary, and the backup asks for the
// primary's whole state again; one that comes so after the takeover is refused for good (the job's
// state is split). An asynchronous job's backup that took over applies no push until every worker
// has registered with it (or had left): until then a worker bound to the old primary's epoch could
// go on there (cut off, not dead), and what this server applied would be lost with it, should it
// die. A finished job's server stops after a grace, once its workers have said goodbye (or a
// following backup once its primary has), or at the latest after finish_wait.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sketchsgd/server/engine.hpp>
#include <sketchsgd/server/replication.hpp>

namespace sketchsgd::ps {

struct ReplicaOptions {
  bool backup = false;  ///< follows a primary (over the link the caller carries)
  Millis finish_grace{500};
  Millis finish_wait{30000};
};

class Replica {
 public:
  using Log = std::function<void(const std::string&)>;
  Replica(Engine& engine, ReplicaOptions opts, Log log);

  /// A message on the server's own port. Frames for the primary (a takeover's Deposed notice)
  /// go to `up`.
  void handle(const PeerId& peer, const Frames& frames, Clock::time_point now,
              std::vector<Outgoing>& out, std::vector<Frames>& up, std::string_view user = {});
  /// A message from the primary; the answers go to `up`. Throws ConfigMismatch when the primary
  /// refuses to be followed.
  void upstream(const Frames& frames, Clock::time_point now, std::vector<Frames>& up);
  /// What a new connection to the primary says first.
  Frames reconnected();
  /// The first thing a backup says to its primary.
  Frames follow() const;
  void tick(Clock::time_point now, std::vector<Outgoing>& out);
  /// The job is over here (see the top of this file), or this is a backup whose primary and
  /// workers have all been silent for ten times finish_wait (the job ended without it, or they are
  /// gone): the server may stop. why() says which.
  bool done(Clock::time_point now);
  const std::string& why() const { return why_; }
  /// Tells a backup following this server that the job is over.
  void bye(std::vector<Outgoing>& out) const { primary_.bye(out); }

  bool following() const { return backup_ && !backup_->promoted(); }
  /// Why this server must stop: its backup took over.
  const std::optional<std::string>& deposed() const { return primary_.deposed(); }
  /// When the next timed work is due (a round's deadline), if before the caller's next tick.
  std::optional<Clock::time_point> deadline() const {
    return following() ? std::nullopt : engine_.deadline();
  }
  const Primary& primary() const { return primary_; }
  const Backup* backup() const { return backup_.get(); }

 private:
  /// A server that did not run for dead_after heartbeats (stopped, swapped out) discounts the
  /// workers it had counted: what it reads now may have waited that long (a Hello of a worker
  /// that has since gone back to its primary and applied rounds there).
  void woke(Clock::time_point now);

  Engine& engine_;
  ReplicaOptions opts_;
  Log log_;
  Primary primary_;
  std::unique_ptr<Backup> backup_;
  uint64_t ignored_ = 0;    // messages a following backup did not answer
  uint64_t probes_ = 0;     // Probes it sent
  uint64_t releases_ = 0;   // Probes that released a worker
  bool gathering_ = false;  // taken over (asynchronous job): pushes wait for every worker
  std::optional<Clock::time_point> ran_;  // when this server last ran (a handle or a tick)
  Clock::time_point heard_{};  // a following backup: its primary's or a worker's last word
  std::string why_;            // what done() found
  std::deque<std::pair<PeerId, Frames>> waiting_;  // those pushes, in order
  std::optional<Clock::time_point> finished_at_;
};

}  // namespace sketchsgd::ps
