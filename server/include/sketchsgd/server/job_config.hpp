// A parameter-server job's configuration: who takes part, the codec, the step, the round policy
// or the asynchronous mode, the shard, checkpoints. Shared by the Engine and its parts.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include <sketchsgd/core/device.hpp>
#include <sketchsgd/ps/outer.hpp>
#include <sketchsgd/ps/protocol.hpp>

namespace sketchsgd::ps {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

/// What happens when a round's deadline passes before every worker has pushed.
enum class Policy : uint8_t {
  Wait,    ///< keep waiting for all W (logged every deadline)
  Quorum,  ///< close with the workers that pushed, if at least min_workers did
  Abort,   ///< end the round without an update; workers move on to the next round
};
Policy parse_policy(std::string_view s);
std::string_view to_string(Policy p);

/// How a round that is short of pushes closes: the rule of a job in rounds (fixed or federated).
struct RoundPolicy {
  Policy policy = Policy::Wait;
  uint32_t min_workers = 0;  ///< quorum size (0: world)
};

/// Synchronous rounds of `world` fixed workers.
struct SyncMode {
  RoundPolicy close;
  /// Bounded staleness (the parameter-server paper's bounded delay): a worker may push up to this
  /// many rounds ahead of the last update it received. 0: synchronous. Not with two-round codecs.
  uint32_t staleness = 0;
};

/// A federated (cross-device) job: `population` clients, `world` of them sampled each round
/// (sample_clients(population, world, sample_seed, round)). A sampled client registers for its
/// round under its id, gets the slot of its place in the sample as its rank, pushes and leaves;
/// every slot is free again once the round has ended. A slot whose client has not come counts as
/// live until the deadline; unless the policy is wait, a round short of its quorum at the
/// deadline, or without any push or live client a deadline after it was first seen so, is aborted
/// (its clients are not coming back: the next round's would wait behind it for ever). A client of
/// the next round may check in while this one runs: it is welcomed then, takes its slot and gets
/// the model the moment its round opens, so its connection and registration are off the round's
/// path. Its clients leave after their round: no bounded staleness.
struct FederatedMode {
  RoundPolicy close;
  uint32_t population = 0;  ///< ≥ world
  uint64_t sample_seed = 1;
};

/// Asynchronous (Downpour): no rounds, no policy; each push is applied as it arrives. One-round
/// codecs only.
struct AsyncMode {
  /// A push older than this many updates of other workers is refused (0: any age is applied).
  uint32_t max_age = 0;
  /// A push's step divided by (1 + its age) (staleness-aware SGD).
  bool age_scaled = true;
};

/// A job's mode: what only some modes have lives in its own type, so that no impossible
/// combination (an asynchronous job with a quorum, a federated one with bounded staleness) can be
/// written.
using JobMode = std::variant<SyncMode, FederatedMode, AsyncMode>;

struct JobConfig {
  uint64_t job = 1;
  uint32_t world = 1;  ///< workers, or a federated job's clients a round
  uint64_t dim = 0;
  std::string spec =
      "sketch";  ///< any spec make_compressor accepts; workers must send its canonical form
  float lr = 0.1f;
  /// The step every holder of the model applies to an update: w −= lr · step, or with momentum
  /// the outer step of a local-SGD job (workers push pseudo-gradients; ps/outer.hpp).
  OuterOptions outer;
  JobMode mode;
  Millis deadline{30000};  ///< per phase, from its first message
  Millis heartbeat{1000};
  uint32_t dead_after = 3;  ///< missed heartbeat intervals before a worker counts as dead
  /// Rounds between the snapshots handed to Hooks::checkpoint (0: none).
  uint64_t checkpoint_every = 0;
  uint64_t max_rounds = 0;     ///< the job ends after this round (0: never)
  bool authenticated = false;  ///< CURVE: a Hello's rank must be the one its key is bound to
  /// A sharded job's part (ps/shards.hpp): dim and spec are then the shard's range and its
  /// share of the codec; workers must name the same shard. Default: the whole model.
  ShardId shard;
  /// Where the aggregator sums and decodes (a GPU: the sketch unsketch runs there). The server's
  /// model copy stays on the host.
  Device device = Device::cpu();

  bool async() const { return std::holds_alternative<AsyncMode>(mode); }
  bool federated() const { return std::holds_alternative<FederatedMode>(mode); }
  /// The mode's values as every part reads them, with what a mode does not have: Wait and 0
  /// rounds of staleness for an asynchronous job, population 0 for fixed workers, max_age 0 and
  /// no age scaling for a job in rounds.
  const RoundPolicy& close() const;
  Policy policy() const { return close().policy; }
  uint32_t min_workers() const { return close().min_workers; }
  uint32_t staleness() const;
  uint32_t population() const;
  uint64_t sample_seed() const;
  uint32_t max_age() const;
  bool age_scaled() const;
  /// The round rule of a job in rounds, to change it; InvalidArgument for an asynchronous job.
  RoundPolicy& closing();
  /// The mode's own fields, to change them (std::bad_variant_access for another mode).
  template <class Mode>
  Mode& as() {
    return std::get<Mode>(mode);
  }

  void validate() const;
  /// Validated, with the defaults filled in: a quorum of the whole world, a whole model's shard.
  JobConfig checked() const;
};

}  // namespace sketchsgd::ps
