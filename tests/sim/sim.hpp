// A deterministic simulation of a parameter-server job (FoundationDB's way, small): primaries,
// backups and workers as the real round logic (Engine, Replica, Session, the links' Liveness) in
// one process, on a simulated clock and network, under a fault schedule drawn from a seed. The
// network is what ZeroMQ over TCP can do: each connection delivers in order after a random
// latency; a partition holds a connection's messages until it heals (TCP retransmits); a
// connection replaced by its owner loses what it still held, sometimes after some of it arrived
// (so old and new connections interleave); a crashed or restarted server loses its connections,
// and its peers' next messages come on new ones; a message is now and then delivered twice (a
// resend whose original also arrived). Servers crash, pause (SIGSTOP) and restart from a
// simulated disk whose last write may be lost or torn. The invariants are checked after every
// event; a seed reproduces a run exactly, its trace included.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sketchsgd::ps::sim {

enum class Kind : uint8_t {
  Rounds,   ///< synchronous rounds that wait for every worker; primary + backup
  Quorum,   ///< rounds that close at their deadline with W − 1 workers; primary + backup
  Stale,    ///< bounded staleness 1; primary + backup
  Async,    ///< Downpour: each push applied as it comes; primary + backup
  Restart,  ///< rounds, one server checkpointing every round, crashed and restarted
  Sharded,  ///< rounds over two shards, each a primary + backup
  /// Cross-device: each round W clients sampled from a population of 3·W, new and stateless,
  /// one push each; quorum W − 1 at the deadline; one server checkpointing every round, crashed
  /// and restarted
  Federated,
};
const char* to_string(Kind k);
Kind parse_kind(const std::string& s);  ///< InvalidArgument for an unknown name
inline constexpr Kind kKinds[] = {Kind::Rounds,  Kind::Quorum,  Kind::Stale,    Kind::Async,
                                  Kind::Restart, Kind::Sharded, Kind::Federated};

struct Scenario {
  Kind kind = Kind::Rounds;
  std::string spec = "topk:k=30";
  uint32_t world = 3;
  uint64_t dim = 300;
  uint64_t rounds = 6;       ///< rounds of the job (Async: pushes of each worker)
                             ///< (Federated: W clients a round, W · rounds in all)
  uint32_t faults = 4;       ///< faults drawn for the schedule
  double duplicates = 0.01;  ///< chance that a message is delivered twice
  /// Faults of the schedule left out (bit i: the i-th drawn), so a failing schedule can be cut
  /// down to the faults it needs; the others stay as drawn.
  uint64_t skip = 0;
  /// The simulator's own test: break the job on purpose, so that the invariants must catch it.
  enum class Sabotage : uint8_t {
    None,
    Corrupt,  ///< worker 0 applies an update twice (the same Update again, for the next round)
    Stall,    ///< worker 0 stops for good after its second push (no fault explains it)
  } sabotage = Sabotage::None;
};

/// The scenario a seed of the soak draws: a kind (unless given) and a codec that kind runs.
Scenario draw(uint64_t seed, std::optional<Kind> kind = std::nullopt);
/// The codecs the simulator runs a kind of job with.
const std::vector<std::string>& codecs(Kind k);

struct Report {
  bool ok = true;
  std::string violation;           ///< the first invariant broken (or the hang), empty when ok
  std::vector<std::string> trace;  ///< the faults and the protocol's events, in order
  uint64_t events = 0;
  uint32_t faults = 0;          ///< injected
  bool finished = false;        ///< every worker holds the last round
  uint32_t failed_workers = 0;  ///< ended with a clear error (allowed: e.g. a torn checkpoint)
  std::string ended_by;         ///< why they could not finish (which server could not serve)
  double sim_seconds = 0;
};

/// Runs the scenario under seed's schedule. keep_trace: the report's trace holds every event
/// (else only the faults).
Report run(const Scenario& s, uint64_t seed, bool keep_trace = false);

/// A failing run cut down: faults left out one at a time while it still fails the same way
/// (its violation's first words), then run again with its whole trace.
Report shrink(Scenario& s, uint64_t seed);

}  // namespace sketchsgd::ps::sim
