// The simulator's clock and network (sim.hpp): an event queue on a simulated clock, and
// connections that do what ZeroMQ over TCP can do. Each delivers in order after a random latency
// and now and then twice (a resend whose original also arrived); a partition holds what crosses
// it until it heals (TCP retransmits); a paused node (SIGSTOP) reads nothing until it runs again;
// a connection its client replaces loses what it still held toward the client, and toward the
// server sometimes too (so old and new connections interleave). Nodes are numbers; what a
// message means is the caller's business.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <sketchsgd/ps/frame.hpp>

namespace sketchsgd::ps::sim {

using Clock = std::chrono::steady_clock;

/// Events in time order (ties in the order they were scheduled): a seed's run is one sequence.
class Clockwork {
 public:
  Clock::time_point now() const { return now_; }
  void at(Clock::time_point t, std::function<void()> f);
  /// Runs the next event (the clock moves to it); false when none is left or the next is past
  /// `limit`.
  bool step(Clock::time_point limit);

 private:
  struct Event {
    Clock::time_point t;
    uint64_t seq;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  Clock::time_point now_ = Clock::time_point{} + std::chrono::hours(1);
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  std::map<uint64_t, std::function<void()>> fns_;
  uint64_t seq_ = 0;
};

class Network {
 public:
  /// A message arrived: on connection `conn`, toward its server (up) or its client.
  using Deliver = std::function<void(int conn, bool up, Frames frames)>;
  Network(Clockwork& clock, std::mt19937_64& rng, double duplicates, Deliver deliver)
      : clock_(clock), rng_(rng), duplicates_(duplicates), deliver_(std::move(deliver)) {}

  /// A new connection from node `client` to node `server`; returns its number.
  int open(int client, int server);
  /// Closed by its client (a new socket replaces it).
  void close(int conn);
  bool closed(int conn) const { return conns_[conn].closed; }
  void send(int conn, bool up, Frames f);
  /// Everything in flight toward node `server` is lost (it crashed, or stopped reading); with
  /// `from` also what it sent (it crashed before the kernel had it).
  void drop(int server, bool from);

  /// Nodes in `side` and the others cannot reach each other for d.
  void partition(std::set<int> side, std::chrono::milliseconds d);
  /// Node n reads nothing (and its owner runs nothing) until t.
  void pause(int node, Clock::time_point until);
  Clock::time_point paused_until(int node) const;

 private:
  struct Pipe {
    std::deque<std::pair<Clock::time_point, Frames>> q;
  };
  struct Conn {
    int client = 0, server = 0;
    bool closed = false;
    Pipe up, down;
  };
  std::optional<Clock::time_point> heal_time(int a, int b) const;
  void drain(int conn, bool up);

  Clockwork& clock_;
  std::mt19937_64& rng_;
  double duplicates_;
  Deliver deliver_;
  std::deque<Conn> conns_;  // a deque: delivering may open more, and references must hold
  std::vector<std::tuple<Clock::time_point, Clock::time_point, std::set<int>>> partitions_;
  std::map<int, Clock::time_point> paused_;
};

}  // namespace sketchsgd::ps::sim
