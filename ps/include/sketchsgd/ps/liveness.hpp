// When a link shows that it is alive, and when it gives up on a silent peer: a heartbeat once
// nothing else went out for an interval, a new connection once the peer has said nothing for
// dead_after intervals plus a backoff that doubles with each new connection (up to backoff_max)
// and starts again once the peer is heard. The worker's link to its server and a backup's to its
// primary run it on their I/O threads; the simulator (tests/sim) on its clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace sketchsgd::ps {

struct Liveness {
  using Clock = std::chrono::steady_clock;
  using Millis = std::chrono::milliseconds;
  static constexpr Millis kFirstBackoff{100};

  Millis heartbeat{1000};
  uint32_t dead_after = 3;
  Millis backoff_max{4000};
  Millis backoff = kFirstBackoff;
  Clock::time_point last_recv{};

  /// Anything came from the peer.
  void heard(Clock::time_point now) {
    last_recv = now;
    backoff = kFirstBackoff;
  }
  bool heartbeat_due(Clock::time_point now, Clock::time_point last_send) const {
    return now - last_send >= heartbeat;
  }
  /// Time for a new connection.
  bool silent(Clock::time_point now) const {
    return now - last_recv > heartbeat * dead_after + backoff;
  }
  /// A new connection was made: the peer gets the whole interval again, and a longer backoff.
  void reconnected(Clock::time_point now) {
    last_recv = now;
    backoff = std::min(backoff * 2, backoff_max);
  }
};

}  // namespace sketchsgd::ps
