// Who may register: a Hello checked against the job (its world, population, rank, shard, dim,
// codec, weight, epoch and, with CURVE, the key's rank), a federated client's slot in this
// round's sample or the next's, one registration per connection, a rank held by a live
// connection kept; then the rank held with a fresh session token and the Welcome sent. The
// traffic of a client checked in for the next round (heartbeats, Bye) is its too.
#pragma once

#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include <sketchsgd/ps/frame.hpp>
#include <sketchsgd/ps/protocol.hpp>
#include <sketchsgd/server/job_config.hpp>
#include <sketchsgd/server/model_store.hpp>
#include <sketchsgd/server/replies.hpp>
#include <sketchsgd/server/roster.hpp>

namespace sketchsgd::ps {

class Admission {
 public:
  Admission(const JobConfig& cfg, Roster& roster, const ModelStore& store, Replies& replies,
            std::function<void(const std::string&)> log);

  /// A Hello (of this job; frames[1] its HelloInfo): refused with a reason, or the rank held and
  /// welcomed (a client checked in ahead is sent this round's model too). Returns the rank that
  /// comes for the model now (a federated client of the running round), if any.
  std::optional<uint32_t> hello(const PeerId& peer, const Envelope& e, const Frames& frames,
                                Clock::time_point now, uint64_t epoch, std::string_view user,
                                std::vector<Outgoing>& out);
  /// Traffic of a client checked in for slot `slot` of the next round: heartbeats and Bye,
  /// nothing else (ProtocolError).
  void waiting(uint32_t slot, const Envelope& e, Clock::time_point now);

 private:
  struct Slot {
    uint32_t index;
    bool ahead;  ///< the next round's: it checks in while this round runs
  };
  /// A federated Hello's slot, or nothing with a refusal sent.
  std::optional<Slot> slot_of(const PeerId& peer, const Envelope& e, std::vector<Outgoing>& out);
  bool federated() const { return cfg_.federated(); }

  const JobConfig& cfg_;
  Roster& roster_;
  const ModelStore& store_;
  Replies& replies_;
  std::function<void(const std::string&)> log_;
  std::mt19937_64 rng_;  // session tokens
};

}  // namespace sketchsgd::ps
