#include <sketchsgd/server/roster.hpp>

#include <algorithm>

#include <sketchsgd/kernels/sample.hpp>

namespace sketchsgd::ps {

Roster::Roster(uint32_t world, uint32_t population, uint64_t sample_seed)
    : population_(population), sample_seed_(sample_seed), workers_(world), next_(world) {}

std::optional<uint32_t> Roster::rank_of(const PeerId& peer) const {
  const auto it = rank_of_.find(peer);
  if (it == rank_of_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint32_t> Roster::waiting_slot(const PeerId& peer) const {
  const auto it = next_of_.find(peer);
  if (it == next_of_.end()) return std::nullopt;
  return it->second;
}

uint32_t Roster::live() const {
  return uint32_t(std::count_if(workers_.begin(), workers_.end(),
                                [](const Worker& w) { return w.registered && w.alive; }));
}

void Roster::sample(uint64_t round) {
  const auto world = uint32_t(workers_.size());
  sampled_ = sample_clients(population_, world, sample_seed_, round);
  next_sampled_ = sample_clients(population_, world, sample_seed_, round + 1);
}

std::optional<uint32_t> Roster::slot_of(uint32_t client, bool ahead) const {
  const auto& sample = ahead ? next_sampled_ : sampled_;
  const auto it = std::lower_bound(sample.begin(), sample.end(), client);
  if (it == sample.end() || *it != client) return std::nullopt;
  return uint32_t(it - sample.begin());
}

Roster::Worker& Roster::hold(const PeerId& peer, uint32_t rank, bool ahead) {
  auto& index = ahead ? next_of_ : rank_of_;
  Worker& w = (ahead ? next_ : workers_)[rank];
  if (w.registered && w.peer != peer) index.erase(w.peer);
  w.peer = peer;
  index[peer] = rank;
  return w;
}

void Roster::leave_waiting(uint32_t slot) {
  next_of_.erase(next_[slot].peer);
  next_[slot] = Worker{};
}

void Roster::release() {
  for (Worker& w : workers_) {
    if (w.registered) rank_of_.erase(w.peer);
    w = Worker{};
  }
}

std::vector<std::pair<uint32_t, bool>> Roster::seat_waiting() {
  std::vector<std::pair<uint32_t, bool>> seated;
  for (uint32_t r = 0; r < next_.size(); ++r) {
    if (!next_[r].registered) continue;
    seated.emplace_back(r, next_[r].behind);
    workers_[r] = next_[r];
    workers_[r].behind = false;
    rank_of_[workers_[r].peer] = r;
  }
  forget_waiting();
  return seated;
}

void Roster::forget_waiting() {
  next_.assign(next_.size(), Worker{});
  next_of_.clear();
}

}  // namespace sketchsgd::ps
