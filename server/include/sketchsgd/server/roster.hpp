// Who the job's workers are: W fixed ranks, or in a federated job the W slots of a round's
// sampled clients (and of the next round's, for clients that check in ahead), the connection
// that holds each and what the server knows of it. The Engine (engine.hpp) decides what is sent
// and when a round ends; the roster only keeps who holds which rank, so that the round logic
// reads the same for fixed workers and federated clients.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <sketchsgd/ps/frame.hpp>

namespace sketchsgd::ps {

class Roster {
 public:
  struct Worker {
    PeerId peer;
    bool registered = false;
    bool alive = false;
    uint64_t session = 0;  ///< token issued in its Welcome; its every message must carry it
    std::chrono::steady_clock::time_point last_seen{};
    /// Checked in ahead with the model of the round before its own: that round's outcome brings
    /// it up to date.
    bool behind = false;
    bool left = false;  ///< said Bye (until it registers again)
    // Asynchronous jobs: the push number expected next (known from its first Hello, kept across
    // registrations), the version it last fetched, its updates applied since, and the reply to
    // its last push (sent again when that push comes again).
    bool numbered = false;
    uint64_t next_push = 0;
    uint64_t base = 0;
    uint64_t own = 0;
    float weight = 1.0f;  // what each of its pushes counts for (its Hello's)
    Frames ack;
  };

  Roster() = default;
  /// world ranks; population > 0: a federated job, whose `world` slots a round are the clients
  /// sample_clients(population, world, sample_seed, round) picks.
  Roster(uint32_t world, uint32_t population, uint64_t sample_seed);

  bool federated() const { return population_ != 0; }
  Worker& operator[](uint32_t rank) { return workers_[rank]; }
  const Worker& operator[](uint32_t rank) const { return workers_[rank]; }
  std::span<Worker> workers() { return workers_; }
  /// Slot `slot` of the next round (a client checked in ahead).
  Worker& waiting(uint32_t slot) { return next_[slot]; }

  /// The rank a connection holds in this round.
  std::optional<uint32_t> rank_of(const PeerId& peer) const;
  /// The slot of the next round a connection has checked in for.
  std::optional<uint32_t> waiting_slot(const PeerId& peer) const;
  /// Registered and not counted dead.
  uint32_t live() const;

  /// A federated job: the samples of `round` and of the one after it.
  void sample(uint64_t round);
  /// The slot of `client` in this round's sample (ahead: the next round's), if it is sampled.
  std::optional<uint32_t> slot_of(uint32_t client, bool ahead) const;

  /// peer holds `rank` from now on (ahead: slot `rank` of the next round), in place of the
  /// connection that held it before, if another; the caller fills in the rest.
  Worker& hold(const PeerId& peer, uint32_t rank, bool ahead);
  /// The client checked in for slot `slot` of the next round will not come: the slot is free.
  void leave_waiting(uint32_t slot);
  /// A federated round has ended: its clients leave, every slot is free.
  void release();
  /// The next round has opened: the clients checked in for it take their slots. Returns those
  /// slots, each with whether its client holds the model of the round before (behind).
  std::vector<std::pair<uint32_t, bool>> seat_waiting();
  /// Forgets every check-in for the next round (they were for a round the server has left).
  void forget_waiting();

 private:
  uint32_t population_ = 0;
  uint64_t sample_seed_ = 1;
  std::vector<Worker> workers_;
  std::map<PeerId, uint32_t> rank_of_;
  std::vector<Worker> next_;  // clients checked in for the next round, by slot
  std::map<PeerId, uint32_t> next_of_;
  std::vector<uint32_t> sampled_;       // this round's clients, in slot order
  std::vector<uint32_t> next_sampled_;  // the next round's
};

}  // namespace sketchsgd::ps
