// What the server sends, composed in one place: a message to a registered rank (its envelope with
// the rank's session token), and the answers to traffic it will not serve (Refuse, Finished, a
// message dropped), with the counts of each that the server reports.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sketchsgd/ps/frame.hpp>
#include <sketchsgd/ps/protocol.hpp>
#include <sketchsgd/server/roster.hpp>

namespace sketchsgd::ps {

class ModelStore;

/// An envelope of this job to anyone (no session token: 0 where the receiver holds none).
Frame envelope(Type t, uint64_t job, uint64_t round, uint32_t rank = 0, uint64_t session = 0);

class Replies {
 public:
  /// The roster gives each rank's connection and token, the store the round a refusal names.
  Replies(uint64_t job, const Roster& roster, const ModelStore& store,
          std::function<void(const std::string&)> log);

  /// An envelope to a registered rank, with its session token.
  Frame to(uint32_t rank, Type t, uint64_t round) const;
  void send(uint32_t rank, Frames frames, std::vector<Outgoing>& out) const;
  /// `message` (envelope, then payload frames) again to a rank, its envelope made the rank's.
  void resend(uint32_t rank, const Frames& message, uint64_t round,
              std::vector<Outgoing>& out) const;

  /// Refuse with a reason (retry: the sender may try again later; elsewhere: another replica
  /// serves the job).
  void refuse(const PeerId& peer, const Envelope& e, bool retry, const std::string& why,
              std::vector<Outgoing>& out, bool elsewhere = false);
  /// "The job finished at round N", to a request that came after the last round (or for a round
  /// past it: `why` says so).
  void finished(const PeerId& peer, const Envelope& e, std::vector<Outgoing>& out,
                std::string why = {});
  /// A message not served (logged and counted).
  void drop(const std::string& why);
  /// A message that carried another registration's token (counted apart, then dropped).
  void replay(const std::string& why);
  /// A refusal whose reply goes another way (an asynchronous push's Abort): counted.
  void count_refusal() { ++rejected_; }

  uint64_t rejected() const { return rejected_; }
  uint64_t replays() const { return replays_; }
  uint64_t late() const { return late_; }

 private:
  uint64_t job_;
  const Roster& roster_;
  const ModelStore& store_;
  std::function<void(const std::string&)> log_;
  uint64_t rejected_ = 0;
  uint64_t replays_ = 0;
  uint64_t late_ = 0;
};

}  // namespace sketchsgd::ps
