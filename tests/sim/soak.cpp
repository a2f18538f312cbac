// sketchsgd_sim: the simulator's soak (tests/sim/sim.hpp). Runs seeds first .. first + seeds − 1,
// each the scenario draw(seed) picks (or the kind and codec given), on --jobs threads, with a
// progress line; stops at the first violation and prints its seed, its scenario and the event
// trace of its schedule cut down to the faults it needs. --out appends one JSON line a job kind
// (benchmarks/sim_table.py makes the docs' table of them). Exit 0: no violation; 1: one found;
// 2: bad flags.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sketchsgd/ps/flags.hpp>
#include "sim/sim.hpp"

using namespace sketchsgd::ps;

namespace {

uint64_t count(const Flags& f, const std::string& name, double lo, double hi) {
  const double v = f.num(name);
  if (!(v >= lo && v <= hi) || v != std::floor(v))
    throw sketchsgd::InvalidArgument("--" + name + " must be a whole number in [" +
                                     std::to_string(uint64_t(lo)) + ", " +
                                     std::to_string(uint64_t(hi)) + "], got " + f.str(name));
  return uint64_t(v);
}

/// One job kind's runs.
struct Tally {
  uint64_t seeds = 0, events = 0, faults = 0, finished = 0, violations = 0;
  double sim_seconds = 0;
  // The clear errors that ended runs early: how often, and the lowest seed of each.
  std::map<std::string, std::pair<uint64_t, uint64_t>> endings;
};

std::string quoted(const std::string& s) {
  std::string o = "\"";
  for (char c : s) o += (c == '"' || c == '\\') ? '\'' : c;
  return o + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  Flags f("sketchsgd_sim [--seeds N] [--first S] [--jobs J] [--kind K] [--spec S] [--out F]");
  f.add("seeds", "200", "how many seeds to run (1e6 and the like accepted)");
  f.add("first", "1", "the first seed");
  f.add("jobs", "1", "threads");
  f.add("kind", "",
        "only this job kind: rounds, quorum, stale, async, restart, sharded, federated");
  f.add("spec", "", "only this codec (with --kind)");
  f.add("faults", "", "faults per schedule (default: as the seed draws, 1..6)");
  f.add("out", "", "append one JSON line a job kind to this file");
  f.add("trace", "0", "print the whole trace of seed --first and exit", "", true);
  uint64_t seeds, first, jobs, faults;
  std::optional<sim::Kind> kind;
  std::string spec;
  try {
    if (!f.parse(argc, argv)) return 0;
    seeds = count(f, "seeds", 1, 1e12);
    first = count(f, "first", 0, 1e15);
    jobs = count(f, "jobs", 1, 64);
    faults = f.str("faults").empty() ? UINT64_MAX : count(f, "faults", 0, 64);
    if (!f.str("kind").empty()) kind = sim::parse_kind(f.str("kind"));
    spec = f.str("spec");
    if (!spec.empty() && !kind) throw sketchsgd::InvalidArgument("--spec needs --kind");
  } catch (const sketchsgd::Error& e) {
    std::fprintf(stderr, "sketchsgd_sim: %s\n", e.what());
    return 2;
  }
  const auto scenario = [&](uint64_t seed) {
    sim::Scenario s = sim::draw(seed, kind);
    if (!spec.empty()) s.spec = spec;
    if (faults != UINT64_MAX) s.faults = uint32_t(faults);
    return s;
  };
  try {
    if (f.on("trace")) {
      const sim::Report r = sim::run(scenario(first), first, true);
      for (const auto& line : r.trace) std::printf("%s\n", line.c_str());
      std::printf("%s\n", r.ok ? "ok" : ("VIOLATION: " + r.violation).c_str());
      return r.ok ? 0 : 1;
    }
    (void)sim::run(scenario(first), first);  // a bad --spec fails here, once
  } catch (const sketchsgd::Error& e) {
    std::fprintf(stderr, "sketchsgd_sim: %s\n", e.what());
    return 2;
  }

  std::atomic<uint64_t> next{first}, done{0}, injected{0}, unfinished{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::optional<uint64_t> failed;
  std::map<std::string, Tally> kinds;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (uint64_t j = 0; j < jobs; ++j)
    pool.emplace_back([&] {
      while (!stop) {
        const uint64_t seed = next++;
        if (seed >= first + seeds) return;
        const sim::Scenario s = scenario(seed);
        sim::Report r;
        try {
          r = sim::run(s, seed);
        } catch (const std::exception& e) {
          r.ok = false;
          r.violation = std::string("the simulator threw: ") + e.what();
        }
        injected += r.faults;
        unfinished += !r.finished;
        {
          std::lock_guard lock(mu);
          Tally& t = kinds[sim::to_string(s.kind)];
          ++t.seeds;
          t.events += r.events;
          t.faults += r.faults;
          t.finished += r.finished;
          t.sim_seconds += r.sim_seconds;
          if (!r.finished) {
            auto& e = t.endings[r.ended_by.empty() ? "(a worker still waiting)" : r.ended_by];
            if (!e.first || seed < e.second) e.second = seed;
            ++e.first;
          }
          if (!r.ok) {
            ++t.violations;
            if (!failed || seed < *failed) failed = seed;
          }
        }
        ++done;
        if (!r.ok) stop = true;
      }
    });
  std::thread progress([&] {
    while (done < seeds && !stop) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "\r%llu / %llu seeds, %.0f a second, %llu faults, %llu ended early   ",
                   (unsigned long long)done.load(), (unsigned long long)seeds, double(done) / s,
                   (unsigned long long)injected.load(), (unsigned long long)unfinished.load());
    }
  });
  for (auto& t : pool) t.join();
  progress.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\n");
  std::printf("%llu seeds, %s, %.1f s\n", (unsigned long long)done.load(),
              failed ? "stopped at a violation" : "no violation", secs);
  for (const auto& [name, t] : kinds) {
    std::printf("%-8s %9llu seeds %11llu events %9llu faults %9llu finished\n", name.c_str(),
                (unsigned long long)t.seeds, (unsigned long long)t.events,
                (unsigned long long)t.faults, (unsigned long long)t.finished);
    for (const auto& [why, n] : t.endings)
      std::printf("         %9llu ended early: %s (lowest seed %llu)\n",
                  (unsigned long long)n.first, why.c_str(), (unsigned long long)n.second);
  }
  if (!f.str("out").empty()) {
    std::ofstream out(f.str("out"), std::ios::app);
    for (const auto& [name, t] : kinds) {
      out << "{\"kind\":" << quoted(name) << ",\"seeds\":" << t.seeds << ",\"first\":" << first
          << ",\"events\":" << t.events << ",\"faults\":" << t.faults
          << ",\"finished\":" << t.finished << ",\"violations\":" << t.violations
          << ",\"sim_seconds\":" << t.sim_seconds << ",\"wall_seconds\":" << secs
          << ",\"jobs\":" << jobs << ",\"ended\":{";
      bool comma = false;
      for (const auto& [why, n] : t.endings) {
        out << (comma ? "," : "") << quoted(why) << ":[" << n.first << "," << n.second << "]";
        comma = true;
      }
      out << "}}\n";
    }
    if (!out) {
      std::fprintf(stderr, "sketchsgd_sim: cannot write %s\n", f.str("out").c_str());
      return 2;
    }
  }
  if (failed) {
    sim::Scenario s = scenario(*failed);
    const sim::Report r = sim::shrink(s, *failed);
    std::printf("VIOLATION at seed %llu (%s, %s, %u faults, %u left after shrinking): %s\n",
                (unsigned long long)*failed, sim::to_string(s.kind), s.spec.c_str(), s.faults,
                r.faults, r.violation.c_str());
    for (const auto& line : r.trace) std::printf("  %s\n", line.c_str());
    std::printf("again: sketchsgd_sim --seeds 1 --first %llu --kind %s --spec '%s' --trace\n",
                (unsigned long long)*failed, sim::to_string(s.kind), s.spec.c_str());
    return 1;
  }
  return 0;
}
