#include "sim/sim.hpp"
#include "sim/world.hpp"

#include <map>
#include <mutex>

namespace sketchsgd::ps::sim {

const char* to_string(Kind k) {
  switch (k) {
    case Kind::Rounds:
      return "rounds";
    case Kind::Quorum:
      return "quorum";
    case Kind::Stale:
      return "stale";
    case Kind::Async:
      return "async";
    case Kind::Restart:
      return "restart";
    case Kind::Sharded:
      return "sharded";
    case Kind::Federated:
      return "federated";
  }
  return "?";
}

Kind parse_kind(const std::string& s) {
  for (Kind k : kKinds)
    if (s == to_string(k)) return k;
  throw InvalidArgument("sim: unknown job kind '" + s +
                        "' (rounds, quorum, stale, async, restart, sharded, federated)");
}

namespace {

/// The fault-free run's final model, per scenario (its rounds wait for every worker: the model
/// does not depend on timing).
std::vector<float> reference(const Scenario& s) {
  static std::mutex mu;
  static std::map<std::string, std::vector<float>> cache;
  std::lock_guard lock(mu);
  const std::string key = std::string(to_string(s.kind)) + "|" + s.spec + "|" +
                          std::to_string(s.world) + "|" + std::to_string(s.dim) + "|" +
                          std::to_string(s.rounds);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Scenario clean = s;
  clean.sabotage = Scenario::Sabotage::None;
  clean.duplicates = 0;
  World w(clean, 0, false, false);
  const Report r = w.go();
  if (!r.ok) throw Error("sim: the fault-free run failed: " + r.violation);
  return cache[key] = w.final_model();
}

}  // namespace

const std::vector<std::string>& codecs(Kind k) {
  // Bounded staleness, asynchronous and federated jobs take one-round codecs; a sharded PowerSGD
  // needs a tensor for each shard.
  static const std::vector<std::string> one_round = {"dense", "topk:k=30",
                                                     "sketch:k=20,cols=200,fetch=1"};
  static const std::vector<std::string> every = {
      "dense", "topk:k=30", "sketch:k=20,cols=200,fetch=1", "sketch:k=20,cols=200,p2=2",
      "powersgd:rank=2,layout=15x20"};
  static const std::vector<std::string> sharded = {
      "dense", "topk:k=30", "sketch:k=20,cols=200,fetch=1", "sketch:k=20,cols=200,p2=2",
      "powersgd:rank=2,layout=15x10+15x10"};
  // A federated round's clients are new (no codec state of their own).
  return k == Kind::Stale || k == Kind::Async || k == Kind::Federated ? one_round
         : k == Kind::Sharded                                         ? sharded
                                                                      : every;
}

Scenario draw(uint64_t seed, std::optional<Kind> kind) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 7);
  Scenario s;
  s.kind = kKinds[rng() % std::size(kKinds)];
  if (kind) s.kind = *kind;
  const auto& specs = codecs(s.kind);
  s.spec = specs[rng() % specs.size()];
  s.faults = 1 + uint32_t(rng() % 6);
  return s;
}

Report shrink(Scenario& s, uint64_t seed) {
  const Report first = run(s, seed, false);
  if (first.ok) return first;
  const auto head = [](const std::string& v) { return v.substr(0, v.find_first_of("0123456789")); };
  for (uint32_t k = 0; k < s.faults && k < 64; ++k) {
    Scenario t = s;
    t.skip |= uint64_t(1) << k;
    const Report r = run(t, seed, false);
    if (!r.ok && head(r.violation) == head(first.violation)) s = t;
  }
  return run(s, seed, true);
}

Report run(const Scenario& s, uint64_t seed, bool keep_trace) {
  World w(s, seed, keep_trace, true);
  if (s.kind == Kind::Rounds || s.kind == Kind::Sharded ||
      (s.kind == Kind::Restart && s.spec == "dense") || s.kind == Kind::Federated)
    w.expect(reference(s));
  return w.go();
}

}  // namespace sketchsgd::ps::sim
