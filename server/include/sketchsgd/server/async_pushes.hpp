// An asynchronous job (DistBelief's Downpour): no rounds. Each push is decoded and applied as it
// arrives, and only its pusher gets the update (its codec's error feedback needs it); workers
// fetch the model when they choose. The store's round counts the updates applied. A push's age is
// the number of other workers' updates applied since its pusher fetched the model it computed
// on; its step is lr · weight / world (the weight its pusher declared: the steps or tokens a push
// represents, 1 by default), divided by (1 + age) unless age_scaled is off, and a push older than
// max_age is refused (Abort: nothing applied, the worker keeps its error feedback and fetches).
// The envelope of a Push and of its Update carries the worker's own push number, so a push sent
// again after a lost reply is answered again, never applied twice.
#pragma once

#include <sketchsgd/server/push_handle.hpp>

namespace sketchsgd::ps {

class AsyncPushes final : public PushHandle {
 public:
  explicit AsyncPushes(const Parts& parts);

  /// Refused, or applied at once and answered to its pusher alone.
  void push(uint32_t rank, const Envelope& e, const Frames& frames, Clock::time_point now,
            std::vector<Outgoing>& out) override;
  void answer(uint32_t rank, const Envelope& e, const Frames& frames) override;
  void progress(Clock::time_point, std::vector<Outgoing>&) override {}
  std::optional<Clock::time_point> deadline() const override { return std::nullopt; }
  void reset() override {}
  void restart() override {}
  /// The pusher's numbering: the push, sent again to this server after a failover, is answered.
  void followed(const CommitInfo& c, const Frames& outcome) override;

 private:
  RoundMetrics metrics_;
};

}  // namespace sketchsgd::ps
