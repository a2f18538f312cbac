// Primary-backup replication of one server's state (the Parameter Server paper's replicated key
// ranges, in its simplest chain: one primary, one backup), as round logic free of sockets and
// clocks like the Engine it wraps; server.hpp runs it over the transport.
//
//   backup ── Follow ──────────────────────► primary      (on start, and on every new socket)
//          ◄─ Sync: the whole state ────────             (answered by Ack)
//          ◄─ Commit: round r's outcome ────             before any worker sees it
//          ── Ack(r + 1) ───────────────────►            then the Update goes to the workers
//          ◄─ Left: rank w said goodbye ─────
//
// The primary holds a round's outgoing messages until its backup has acknowledged the round, so
// every update a worker has seen is on both servers: when workers find the primary silent they
// register with the backup, which takes over (its epoch one more than the primary's) and runs the
// next round as the primary would have (the merge is in rank order, so bit for bit). A round the
// backup never acknowledged was seen by no worker: they push it again there. A primary whose
// backup took over is told so by the backup (Deposed, at once and on every new connection to it)
// and stops; its backup lost, it goes on alone. Only that notice deposes it, and only with the
// token of the primary's own Sync: a worker's claimed epoch is hearsay (the engine sends such a
// worker on to its next replica), a Follow carries no evidence, and a server that never had a
// backup handed its token to nobody. A live backup keeps its role against other connections'
// Follows, and asks for the whole state at most once an interval; a backup lost while it held a
// round, having acknowledged nothing (a peer that only held rounds), keeps the next out for a
// cool-down that doubles with each such loss.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <sketchsgd/server/engine.hpp>

namespace sketchsgd::ps {

/// The primary's side: every incoming message passes through handle(); the backup's go to the
/// replication, the workers' to the engine, whose round-ending messages are held until the
/// backup acknowledges the round. Without a backup it is the engine alone.
class Primary {
 public:
  using Log = std::function<void(const std::string&)>;
  /// Observes the engine's round ends (Engine::observe) until destroyed.
  Primary(Engine& engine, Log log);
  ~Primary();
  Primary(const Primary&) = delete;
  Primary& operator=(const Primary&) = delete;

  void handle(const PeerId& peer, const Frames& frames, Clock::time_point now,
              std::vector<Outgoing>& out, std::string_view user = {});
  /// The engine's clock, and the backup's liveness: one silent for dead_after heartbeats, or
  /// that has not acknowledged a round within the deadline, is dropped and the round released.
  void tick(Clock::time_point now, std::vector<Outgoing>& out);
  /// Tells the backup the job is over (it stops once the job has finished).
  void bye(std::vector<Outgoing>& out) const;

  bool has_backup() const { return backup_.has_value(); }
  /// A round waits for the backup's acknowledgement.
  bool holding() const { return awaiting_.has_value(); }
  /// Why this server must stop: its backup took over.
  const std::optional<std::string>& deposed() const { return deposed_; }

 private:
  struct Deferred {
    PeerId peer;
    Frames frames;
    std::string user;
  };
  void on_backup(const PeerId& peer, const Envelope& e, const Frames& frames, Clock::time_point now,
                 std::vector<Outgoing>& out, std::string_view user);
  /// A message that came while a round waits for the backup, kept for release().
  void defer(const PeerId& peer, const Frames& frames, std::string_view user);
  /// A worker's message to the engine; what a round's end sends waits for the backup.
  void pass(const PeerId& peer, const Frames& frames, Clock::time_point now,
            std::vector<Outgoing>& out, std::string_view user);
  /// After the engine ran: the backup follows what changed its state before anyone sees it.
  void replicate(uint64_t round_before, bool model_before, std::vector<Outgoing>& staged,
                 Clock::time_point now, std::vector<Outgoing>& out);
  void sync(Clock::time_point now, std::vector<Outgoing>& out);
  /// A Sync's first frame: epoch, token, the last outcome and the push numbers.
  ReplicaInfo replica_info() const;
  /// The whole state again (a backup followed, or asked again), the held round's deadline kept.
  void resync(Clock::time_point now, std::vector<Outgoing>& out);
  /// The held messages go out, then the messages deferred meanwhile are handled.
  void release(Clock::time_point now, std::vector<Outgoing>& out);
  void lose_backup(const std::string& why, Clock::time_point now, std::vector<Outgoing>& out);

  Engine& engine_;
  Log log_;
  std::optional<PeerId> backup_;
  Clock::time_point backup_seen_{};
  std::optional<uint64_t> awaiting_;  // the round the backup must acknowledge
  Clock::time_point awaiting_since_{};
  std::vector<Outgoing> held_;     // sent once it has
  std::vector<Outgoing> commits_;  // the rounds that ended in this engine call
  std::deque<Deferred> deferred_;  // worker messages that came meanwhile
  uint64_t dropped_ = 0;           // deferred messages dropped for room
  std::optional<std::string> deposed_;
  uint64_t token_ = 0;                // in every Sync; a Deposed notice must carry it
  Clock::time_point last_sync_{};     // Syncs are at most one an interval
  bool resync_ = false;               // the backup asked again within the interval
  uint64_t ignored_follows_ = 0;      // of other connections while the backup was live
  bool acked_ = false;                // the backup has acknowledged a round or a Sync
  unsigned strikes_ = 0;              // backups lost in a row before they acknowledged anything
  Clock::time_point follow_after_{};  // no new backup before (the cool-down after a strike)
  uint32_t backup_connection_ = 0;    // the latest connection its own backup has followed on
  bool rejoin_ = false;  // its own backup's later connection may replace it (once an Ack)
  bool stated_ = false;  // the backup has been sent a state (its silence counts from then)
};

/// The backup's side: the messages of its link to the primary in, its answers out. Holds the
/// primary's state in the engine until a worker comes (promote()), then serves as the primary.
class Backup {
 public:
  using Log = std::function<void(const std::string&)>;
  Backup(Engine& engine, Log log);

  /// The Follow to send on the current connection to the primary: the connection's number and,
  /// once synced, the primary's token in its envelope (rank, session), so the primary tells this
  /// backup's later connection from a stranger and from what an earlier one still delivers.
  Frames follow() const;
  /// What a new connection to the primary says first (its number one more): a Follow, or once
  /// promoted the Deposed notice again (a primary cut off when this took over learns it when the
  /// link comes back).
  Frames reconnected();
  /// A message from the primary; answers (Ack, or Deposed once promoted) go to `replies`. One
  /// it cannot apply (corrupt, out of turn) changes nothing and is answered with a Follow: the
  /// primary sends its whole state again. Throws ConfigMismatch when the primary refuses to be
  /// followed (another job).
  void handle(const Frames& frames, std::vector<Frames>& replies);
  /// Holds the primary's state (a Sync came, and the primary still counts on this backup): only
  /// then can it take over.
  bool synced() const { return synced_; }
  bool promoted() const { return promoted_; }
  /// What a message on this backup's own port means while it follows.
  enum class Verdict : uint8_t {
    Ignore,    ///< stay silent: not a Hello or Present this job would accept, no state yet, the
               ///< primary still heard from, a Present that answers no probe of now, or more
               ///< workers to come
    Behind,    ///< the worker has applied rounds this backup never had (its primary lost it and
               ///< went on alone): answer refusal(), follow again (unsync())
    Probe,     ///< a Hello while the primary is silent: answer probe(), and count the worker only
               ///< once it answers (a Hello may have waited in the network while its worker went
               ///< back to the primary and applied rounds there)
    TakeOver,  ///< every worker has answered a probe while the primary was silent: promote()
    Release,   ///< a Hello that claims a later epoch (its worker answered a probe of this
               ///< backup's) while the primary is heard: answer release()
  };
  /// A worker counts toward a takeover only if this job would accept its Hello (its id, world,
  /// rank range, dim, shard and codec), the primary has been silent to this backup too for
  /// dead_after heartbeats, the worker holds no round this backup lacks, and it answered this
  /// backup's probe (Present, with the probe's nonce) within dead_after heartbeats, no longer
  /// than hold() ago: a worker answers only while registered nowhere, and then keeps away from
  /// servers of the primary's epoch (so it applies no round there that this backup lacks) until
  /// it registers here or this backup, hearing its primary again, releases it. The backup takes
  /// over once every rank so counts (a worker not heard
  /// from might hold a round the primary released after it lost this backup), those that left
  /// counted (the primary says so, Left: what they were answered, this backup holds), or at the
  /// first Hello once the job's last round is done here.
  Verdict consider(const Frames& frames, Clock::time_point now);
  /// The Probe that answers the Hello consider() found so (Verdict::Probe).
  Frames probe(const Frames& hello, Clock::time_point now);
  /// The answer to a Hello consider() found to need a release (Verdict::Release): the Probe that
  /// frees its worker to go back to the primary. Safe only so: this backup has heard its primary
  /// since its last probe, which voided every answer.
  Frames release(const Frames& hello) const;
  /// How long a worker's answer counts.
  Millis hold() const;
  /// Anything came from the primary: workers that come now do not mean it is gone.
  void heard(Clock::time_point now);
  /// A Hello of a worker that has applied rounds this backup never had (an asynchronous
  /// worker's: more of its pushes answered than this backup applied).
  bool behind(const Frames& hello) const;
  /// Having found itself behind: it no longer counts as holding the primary's state. Returns the
  /// Follow that asks the primary, should it be alive, for all of it again.
  Frames unsync();
  /// The answer to a worker that is ahead: try again at the next replica (the primary, if it
  /// lives); or, once this backup has taken over (the job's state is split), for good.
  Frames refusal(const Frames& hello) const;
  /// The ranks the primary said left.
  const std::set<uint32_t>& left() const { return left_; }
  /// Every rank has registered with this server or said goodbye to the primary.
  bool everyone_here() const;
  /// Takes over from the primary: the epoch goes one up. Returns the Deposed notice for the
  /// primary (should it only be paused or cut off, it stops when it reads it); its later
  /// messages are answered so too.
  Frames promote();
  /// The primary said the job is over (Bye).
  bool primary_done() const { return primary_done_; }

 private:
  void apply(const Frames& frames, std::vector<Frames>& replies);
  Frames reply(Type t, uint64_t round, Frames payload = {}) const;
  Frames notice() const;  // Deposed

  Engine& engine_;
  Log log_;
  bool synced_ = false;
  bool promoted_ = false;
  bool primary_done_ = false;
  uint64_t token_ = 0;       // the primary's, from its Sync: the evidence a Deposed notice carries
  uint32_t connection_ = 0;  // connections to the primary before the current one
  Clock::time_point heard_{};  // the primary's last message
  struct Asked {
    uint64_t nonce = 0;
    Clock::time_point at{};
  };
  std::map<uint32_t, Asked> asked_;  // each rank's last probe since the primary fell silent
  std::map<uint32_t, Clock::time_point> came_;  // ranks that answered one: when it went
  uint64_t probes_ = 0;                         // probes sent (for their nonces)
  std::set<uint32_t> left_;                     // ranks that said goodbye (Left, or the Sync)
};

}  // namespace sketchsgd::ps
