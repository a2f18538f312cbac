// How a job serves its workers' pushes, in the manner of ps-lite's request handle: in rounds
// (synchronous, with a policy for the late, bounded staleness, federated samples: rounds.hpp) or
// one push at a time (asynchronous: async_pushes.hpp). The Engine admits the workers and routes
// each registered rank's Push and Answer to its job's handle; a handle ends a round through
// Parts::commit, which the Engine owns (observers, the store's commit, a federated round's
// seating).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/ps/frame.hpp>
#include <sketchsgd/ps/protocol.hpp>
#include <sketchsgd/server/hooks.hpp>
#include <sketchsgd/server/job_config.hpp>
#include <sketchsgd/server/model_store.hpp>
#include <sketchsgd/server/replies.hpp>
#include <sketchsgd/server/roster.hpp>

namespace sketchsgd::ps {

/// What a handle works with: the Engine's parts, and the two services of the Engine's own.
struct Parts {
  const JobConfig& cfg;
  const Hooks& hooks;
  ModelStore& store;
  Roster& roster;
  Replies& replies;
  /// The model to rank (or as soon as it exists).
  std::function<void(uint32_t rank, std::vector<Outgoing>& out)> pull;
  /// Ends the store's round with this outcome (envelope, then its payload frames), after the
  /// handle has sent it; the handle is reset() for the next round.
  std::function<void(Frames outcome, std::vector<Outgoing>& out)> commit;
};

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// Whether a pushed message names this rank and round (the aggregator validates the whole
/// message, checksum included, right after).
inline bool from(std::span<const uint8_t> m, uint32_t rank, uint64_t round) {
  const Origin o = peek_origin(m);
  return o.sender == rank && o.round == round;
}

class PushHandle {
 public:
  explicit PushHandle(const Parts& parts)
      : cfg_(parts.cfg),
        hooks_(parts.hooks),
        store_(parts.store),
        roster_(parts.roster),
        replies_(parts.replies),
        pull_(parts.pull),
        commit_(parts.commit) {}
  virtual ~PushHandle() = default;
  PushHandle(const PushHandle&) = delete;
  PushHandle& operator=(const PushHandle&) = delete;

  /// A registered rank's Push (frames[1] its codec message); the model exists. Throws Error for
  /// a message that is dropped.
  virtual void push(uint32_t rank, const Envelope& e, const Frames& frames, Clock::time_point now,
                    std::vector<Outgoing>& out) = 0;
  /// A registered rank's Answer to a two-round codec's Query.
  virtual void answer(uint32_t rank, const Envelope& e, const Frames& frames) = 0;
  /// Ends what the messages so far and the clock allow.
  virtual void progress(Clock::time_point now, std::vector<Outgoing>& out) = 0;
  /// When the clock next matters (a round's deadline), if it does.
  virtual std::optional<Clock::time_point> deadline() const = 0;

  /// The store's round has ended (here or by a backup's follow): a fresh round's state.
  virtual void reset() = 0;
  /// The store was restored from a checkpoint: pushes held for later rounds are forgotten too.
  virtual void restart() = 0;
  /// A backup followed its primary's round (its outcome): what the handle keeps of it.
  virtual void followed(const CommitInfo&, const Frames& /*outcome*/) {}
  /// Pushes held for rounds ahead (bounded staleness).
  virtual bool holds_later_pushes() const { return false; }
  /// The rank pushed the last round (a finished job of fixed workers waits for its Bye).
  virtual bool pushed_last(uint32_t /*rank*/) const { return false; }

 protected:
  const JobConfig& cfg_;
  const Hooks& hooks_;
  ModelStore& store_;
  Roster& roster_;
  Replies& replies_;
  std::function<void(uint32_t, std::vector<Outgoing>&)> pull_;
  std::function<void(Frames, std::vector<Outgoing>&)> commit_;
};

}  // namespace sketchsgd::ps
