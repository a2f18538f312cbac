// The fault schedule a seed draws: partitions, pauses, kills and restarts, torn writes.
#include "sim/world.hpp"

namespace sketchsgd::ps::sim {

void World::schedule_faults(uint64_t seed) {
  // Drawn from a generator of their own, so leaving one out changes no other.
  std::mt19937_64 rng(seed ^ 0xD1B54A32D192ED03ull);
  const int nodes = int(servers_.size() + workers_.size());
  std::set<int> crashed_shards;
  for (uint32_t k = 0; k < sc_.faults; ++k) {
    const auto t = now_ + std::chrono::milliseconds(rng() % 800);
    const auto d = std::chrono::milliseconds(50 + rng() % 1500);
    const uint64_t what = rng() % 4, pick = rng();
    if (k < 64 && (sc_.skip >> k) & 1) continue;
    switch (what) {
      case 0: {  // one node cut off from the rest, or some servers from everything else
        std::set<int> side;
        if (pick % 3 == 0) {
          for (size_t i = 0; i < servers_.size(); ++i)
            if ((pick >> (8 + i)) & 1) side.insert(int(i));
        } else {
          side.insert(int((pick >> 8) % nodes));
        }
        at(t, [this, side, d] {
          std::string who;
          for (int n : side) who += " " + node_name(n);
          fault("partition {" + who + " } for " + std::to_string(d.count()) + " ms");
          net_.partition(side, d);
        });
        break;
      }
      case 1: {  // SIGSTOP, SIGCONT later
        const int n = int((pick >> 8) % nodes);
        at(t, [this, n, d] {
          fault("SIGSTOP " + node_name(n) + " for " + std::to_string(d.count()) + " ms");
          net_.pause(n, now_ + d);
        });
        break;
      }
      default: {  // kill -9 of a server: a replicated one stays down, a lone one restarts
        const int i = int((pick >> 8) % servers_.size());
        if (replicated_ && crashed_shards.count(int(servers_[i]->shard))) break;
        crashed_shards.insert(int(servers_[i]->shard));
        at(t, [this, i, d] {
          crash(i);
          if (!replicated_)
            at(now_ + d, [this, i] {
              if (servers_[i]->state != SState::Down) return;
              fault("restart " + servers_[i]->name);
              start_server(i, true);
            });
        });
        break;
      }
    }
  }
}

std::string World::node_name(int n) const {
  return n < int(servers_.size()) ? servers_[n]->name
                                  : "worker " + std::to_string(n - int(servers_.size()));
}

}  // namespace sketchsgd::ps::sim
