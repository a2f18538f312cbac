// A job in rounds: every registered worker Pushes its Gradient message; the codec's aggregator
// merges them in compressed form (sketch tables summed, sparse lists merged), in rank order so
// that the sums do not depend on arrival order; for two-round codecs the contributors are sent a
// Query and their Answers summed; then the Update goes to every registered worker and the store
// applies it (w −= lr · step, or the outer step: ps/outer.hpp). The policy decides what a round
// whose deadline passed does (wait, close with a quorum, abort); with bounded staleness a push
// for up to `staleness` rounds ahead is held until its round opens. A federated round's slots are
// its sampled clients'.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <sketchsgd/server/push_handle.hpp>

namespace sketchsgd::ps {

class Rounds final : public PushHandle {
 public:
  explicit Rounds(const Parts& parts);

  void push(uint32_t rank, const Envelope& e, const Frames& frames, Clock::time_point now,
            std::vector<Outgoing>& out) override;
  void answer(uint32_t rank, const Envelope& e, const Frames& frames) override;
  /// Closes phases while the policy allows (several rounds when early pushes were held).
  void progress(Clock::time_point now, std::vector<Outgoing>& out) override;
  std::optional<Clock::time_point> deadline() const override;
  void reset() override;
  void restart() override;
  bool holds_later_pushes() const override { return !early_.empty(); }
  bool pushed_last(uint32_t rank) const override;

 private:
  /// Closes the current phase when the policy allows; true when it did.
  bool progress_once(Clock::time_point now, std::vector<Outgoing>& out);
  /// Starts the next round with the pushes held for it (bounded staleness).
  void replay_held(Clock::time_point now);
  void close_phase(Clock::time_point now, std::vector<Outgoing>& out, std::string reason);
  void abort_round(Clock::time_point now, std::vector<Outgoing>& out, std::string reason);
  /// Sends the round's outcome (Update or Abort + payload frames) to every registered worker
  /// and commits it.
  void end_round(Type outcome, Frames payload, Clock::time_point now, std::vector<Outgoing>& out);
  /// The round's metrics to Hooks::round (before it is committed).
  void report_round();
  /// Merges held messages in rank order, so the float sums (and so the model) do not depend on
  /// arrival order: up to the first expected rank still missing, or all of them when closing.
  void absorb_in_order(bool closing);
  void start_phase(MessageKind kind);
  bool federated() const { return cfg_.federated(); }

  // the running round
  std::vector<bool> pushed_;       // gradient phase contributors
  std::vector<bool> answered_;     // answer phase contributors
  std::vector<bool> last_pushed_;  // the last round's contributors (pushed_last)
  std::vector<Frame> held_;        // messages of this phase waiting for their turn to merge
  Frame query_;                    // the second phase's Query, asked again of a rank that lost it
  uint32_t cursor_ = 0;            // ranks below it are merged (or skipped)
  MessageKind phase_ = MessageKind::Gradient;
  std::optional<Clock::time_point> round_start_;
  std::optional<std::pair<uint64_t, Clock::time_point>> empty_since_;  // a federated round's
  Clock::time_point phase_start_{};
  Clock::time_point last_wait_log_{};
  RoundMetrics metrics_;
  double merge_ms_ = 0;

  std::map<uint64_t, std::vector<Frame>> early_;  // pushes of rounds ahead, by round then rank
};

}  // namespace sketchsgd::ps
