#include "sim/network.hpp"

#include <algorithm>

namespace sketchsgd::ps::sim {

void Clockwork::at(Clock::time_point t, std::function<void()> f) {
  const uint64_t id = seq_++;
  fns_.emplace(id, std::move(f));
  queue_.push(Event{t, id});
}

bool Clockwork::step(Clock::time_point limit) {
  if (queue_.empty() || queue_.top().t > limit) return false;
  const Event e = queue_.top();
  queue_.pop();
  now_ = std::max(now_, e.t);
  auto node = fns_.extract(e.seq);
  node.mapped()();
  return true;
}

int Network::open(int client, int server) {
  conns_.push_back(Conn{client, server, false, {}, {}});
  return int(conns_.size()) - 1;
}

void Network::close(int id) {
  Conn& c = conns_[id];
  if (c.closed) return;
  c.closed = true;
  c.down.q.clear();
  if (rng_() % 2) c.up.q.clear();
}

void Network::send(int id, bool up, Frames f) {
  Conn& c = conns_[id];
  if (c.closed) return;
  Pipe& p = up ? c.up : c.down;
  auto t = clock_.now() + std::chrono::microseconds(200 + rng_() % 4800);
  if (!p.q.empty()) t = std::max(t, p.q.back().first);
  if (duplicates_ > 0 && std::uniform_real_distribution<>(0, 1)(rng_) < duplicates_)
    p.q.emplace_back(t, f);
  p.q.emplace_back(t, std::move(f));
  clock_.at(t, [this, id, up] { drain(id, up); });
}

void Network::drop(int server, bool from) {
  for (Conn& c : conns_) {
    if (c.server == server) {
      c.up.q.clear();
      if (from) c.down.q.clear();
    }
    if (from && c.client == server) c.up.q.clear();
  }
}

void Network::partition(std::set<int> side, std::chrono::milliseconds d) {
  partitions_.emplace_back(clock_.now(), clock_.now() + d, std::move(side));
}

void Network::pause(int node, Clock::time_point until) {
  paused_[node] = std::max(paused_until(node), until);
}

Clock::time_point Network::paused_until(int node) const {
  const auto it = paused_.find(node);
  return it == paused_.end() ? Clock::time_point{} : it->second;
}

std::optional<Clock::time_point> Network::heal_time(int a, int b) const {
  std::optional<Clock::time_point> t;
  const auto now = clock_.now();
  for (const auto& [from, until, set] : partitions_)
    if (now >= from && now < until && set.count(a) != set.count(b))
      t = std::max(t.value_or(until), until);
  return t;
}

void Network::drain(int id, bool up) {
  Pipe& p = up ? conns_[id].up : conns_[id].down;
  const int from = up ? conns_[id].client : conns_[id].server;
  const int to = up ? conns_[id].server : conns_[id].client;
  while (!p.q.empty() && p.q.front().first <= clock_.now()) {
    if (const auto heal = heal_time(from, to)) {  // TCP retransmits once it heals
      clock_.at(*heal, [this, id, up] { drain(id, up); });
      return;
    }
    if (const auto t = paused_until(to); t > clock_.now()) {  // read once it runs again
      clock_.at(t, [this, id, up] { drain(id, up); });
      return;
    }
    Frames f = std::move(p.q.front().second);
    p.q.pop_front();
    deliver_(id, up, std::move(f));  // may send, open or close (conns_ keeps p where it is)
  }
}

}  // namespace sketchsgd::ps::sim
