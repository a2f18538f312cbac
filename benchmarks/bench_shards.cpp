// sketchsgd_bench_shards: W workers against S = 1, 2, 4, 8 sharded servers (ps/shards.hpp), in one
// run: the round time, the bytes each server's link carries a round, the servers' CPU per round
// and their memory.
//
// The servers are sketchsgd-server processes (--shards S --shard i), started with an optional
// command prefix per shard (--launch 'ip netns exec NS{i}': bench_shards_links.py puts each on a
// host of its own with a shaped link); the workers are threads of this process, each a Client of
// all S, pushing the same synthetic gradient every round. Lightweight workers: no model and no
// backward pass, one gradient for all (so sparse codecs pick the same coordinates everywhere),
// and all of them share this machine's cores and, without --launch, the servers' too. Round time:
// from the moment the workers start a round to the moment the last has applied its update.
//
// With --replicas each shard also has a backup (sketchsgd-server --replica-of its primary, the
// same launch prefix): every round then waits for the backups' acknowledgements; with --failover
// shard 0's primary is killed (SIGKILL) before a round half-way through, and that round's time
// (the workers notice the silence, move to the backup, which takes over) is reported apart.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/worker/client.hpp>
#include "demo/process.hpp"
#include "rounds.hpp"

namespace {

using namespace sketchsgd;
using namespace sketchsgd::ps;
using bench::Clock;
using bench::median;
using bench::ms;

struct Result {
  double round_ms = 0;
  double link_mb = 0;     ///< the busiest server link's bytes a round, both ways
  double cpu_ms_sum = 0;  ///< all servers' CPU a round
  double cpu_ms_max = 0;  ///< the busiest server's
  double rss_mb_sum = 0;  ///< all servers' resident memory after the last round
  double rss_mb_max = 0;
  double failover_ms = 0;  ///< the round during which shard 0's primary was killed
};

/// {i} replaced by shard i's index, {i+N} by i + N.
std::string fill(std::string s, uint32_t i) {
  for (size_t at; (at = s.find("{i")) != std::string::npos;) {
    const size_t end = s.find('}', at);
    if (end == std::string::npos) throw InvalidArgument("unclosed {i in '" + s + "'");
    const std::string plus = s.substr(at + 2, end - at - 2);  // "" or "+N"
    uint64_t n = 0;
    if (!plus.empty()) {
      if (plus[0] != '+' || plus.size() < 2 ||
          plus.find_first_not_of("0123456789", 1) != std::string::npos)
        throw InvalidArgument("'{i" + plus + "}' in '" + s + "': {i} or {i+N}");
      n = std::stoull(plus.substr(1));
    }
    s.replace(at, end - at + 1, std::to_string(i + n));
  }
  return s;
}

/// A server's bytes a round over its last `rounds` metrics lines: pushes in, updates out.
double link_mb(const std::string& metrics, uint32_t world, int rounds) {
  std::ifstream in(metrics);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  if (lines.size() < size_t(rounds)) throw std::runtime_error(metrics + ": too few rounds");
  double bytes = 0;
  for (size_t k = lines.size() - size_t(rounds); k < lines.size(); ++k) {
    const std::string& l = lines[k];
    const auto a = l.find("\"bytes_up\":[");
    std::stringstream ups(l.substr(a + 12, l.find(']', a) - a - 12));
    for (std::string v; std::getline(ups, v, ',');) bytes += std::stod(v);
    const auto d = l.find("\"bytes_down_each\":");
    bytes += std::stod(l.substr(d + 18)) * world;
  }
  return bytes / rounds / 1e6;
}

struct Setup {
  std::string server_bin;
  std::vector<std::string> launch, backup_launch;
  std::string bind, backup_bind;
  uint64_t d = 0;
  uint32_t world = 0;
  int warm = 0, rounds = 0;
  uint64_t heartbeat_ms = 0;
  std::filesystem::path tmp;
};

Result run(const Setup& st, const std::string& spec, uint32_t shards, bool replicas,
           bool failover) {
  const auto& [server_bin, launch_primary, backup_launch, bind_primary, backup_bind, d, world, warm,
               rounds, heartbeat_ms, tmp] = st;
  std::vector<demo::Process> servers;  // the primaries, then their backups
  std::vector<std::string> endpoints(shards);
  for (uint32_t k = 0; k < (replicas ? 2 * shards : shards); ++k) {
    const uint32_t i = k % shards;
    const bool backup = k >= shards;
    const auto& launch = backup ? backup_launch : launch_primary;
    const auto& bind = backup ? backup_bind : bind_primary;
    std::vector<std::string> cmd;
    for (const auto& w : launch) cmd.push_back(fill(w, i));
    // A long linger: the last round's updates take seconds to cross a slow link.
    const std::vector<std::string> args = {server_bin,
                                           "--bind",
                                           fill(bind, i),
                                           "--world",
                                           std::to_string(world),
                                           "--dim",
                                           std::to_string(d),
                                           "--codec",
                                           spec,
                                           "--shards",
                                           std::to_string(shards),
                                           "--shard",
                                           std::to_string(i),
                                           "--lr",
                                           "0.01",
                                           "--rounds",
                                           std::to_string(warm + rounds),
                                           "--policy",
                                           "wait",
                                           "--deadline-ms",
                                           "120000",
                                           "--heartbeat-ms",
                                           std::to_string(heartbeat_ms),
                                           "--finish-grace-ms",
                                           "100",
                                           "--linger-ms",
                                           "60000",
                                           "--metrics",
                                           (tmp / ("m" + std::to_string(k))).string(),
                                           "--quiet"};
    cmd.insert(cmd.end(), args.begin(), args.end());
    if (backup) cmd.insert(cmd.end(), {"--replica-of", endpoints[i]});
    std::filesystem::remove(tmp / ("m" + std::to_string(k)));
    servers.push_back(demo::Process::spawn(cmd));
    const std::string e = servers.back().line(std::chrono::seconds(30));
    if (e.rfind("tcp://", 0) != 0)
      throw std::runtime_error("server " + std::to_string(k) + " did not start");
    endpoints[i] += (backup ? "|" : "") + e;
  }
  std::string all;
  for (const auto& e : endpoints) all += (all.empty() ? "" : ",") + e;
  const int kill_at = failover ? warm + rounds / 2 : -1;

  const auto g = bench::xorshift_gradient(d);
  const std::vector<float> init(d, 0.0f);
  const int total = warm + rounds;
  std::barrier sync(world + 1);
  std::vector<std::vector<Clock::time_point>> done(world, std::vector<Clock::time_point>(total));
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (uint32_t r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      std::unique_ptr<Client> c;
      try {
        ClientOptions o;
        o.server = all;
        o.rank = r;
        o.world = world;
        o.heartbeat = std::chrono::milliseconds(heartbeat_ms);
        o.timeout = std::chrono::minutes(3);
        o.log = [](const std::string&) {};
        c = std::make_unique<Client>(
            o, make_compressor(spec, d),
            r == 0 ? std::span<const float>(init) : std::span<const float>());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      for (int t = 0; t < total; ++t) {
        sync.arrive_and_wait();  // the round starts
        try {
          if (c) c->step(g);
        } catch (const std::exception& e) {
          errors[r] = e.what();
          c.reset();
        }
        done[r][t] = Clock::now();
        sync.arrive_and_wait();  // every worker has its update
      }
    });
  std::vector<double> round_ms;
  Result res;
  const size_t n = servers.size();
  std::vector<double> cpu0(n), rss(n);
  // The killed primary's CPU stops counting at its death; its backup's carries on.
  std::vector<double> cpu_dead(n, -1);
  for (int t = 0; t < total; ++t) {
    if (t == warm)
      for (size_t i = 0; i < n; ++i) cpu0[i] = bench::cpu_ms(servers[i].pid());
    if (t == total - 1)  // before the last round: a server may be gone once its update is out
      for (size_t i = 0; i < n; ++i)
        if (cpu_dead[i] < 0) rss[i] = bench::rss_mb(servers[i].pid());
    if (t == kill_at) {
      cpu_dead[0] = bench::cpu_ms(servers[0].pid());
      servers[0].kill9();
    }
    const auto start = Clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    if (t < warm) continue;
    Clock::time_point last = start;
    for (const auto& w : done) last = std::max(last, w[t]);
    if (t == kill_at)
      res.failover_ms = ms(last - start);
    else
      round_ms.push_back(ms(last - start));
    std::fprintf(stderr, "\r  S=%u%s round %d/%d: %.0f ms   ", shards, replicas ? " +replicas" : "",
                 t + 1, total, ms(last - start));
  }
  std::fprintf(stderr, "\n");
  for (size_t i = 0; i < n; ++i) {
    const double now = cpu_dead[i] >= 0 ? cpu_dead[i] : bench::cpu_ms(servers[i].pid());
    const double cpu = (now - cpu0[i]) / rounds;
    res.cpu_ms_sum += cpu;
    res.cpu_ms_max = std::max(res.cpu_ms_max, cpu);
    res.rss_mb_sum += rss[i];
    res.rss_mb_max = std::max(res.rss_mb_max, rss[i]);
  }
  for (auto& t : ts) t.join();
  for (uint32_t r = 0; r < world; ++r)
    if (!errors[r].empty())
      throw std::runtime_error("worker " + std::to_string(r) + ": " + errors[r]);
  for (size_t i = 0; i < n; ++i) {
    if (cpu_dead[i] >= 0) continue;
    if (const int rc = servers[i].wait(std::chrono::seconds(30)); rc != 0)
      throw std::runtime_error("server " + std::to_string(i) + " exited with " +
                               std::to_string(rc));
    if (i < shards && !(failover && i == 0))  // the primaries' links (the backups' metrics
      res.link_mb =                           // hold only the rounds they ran themselves)
          std::max(res.link_mb, link_mb((tmp / ("m" + std::to_string(i))).string(), world, rounds));
  }
  res.round_ms = median(round_ms);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f("sketchsgd_bench_shards: W workers against S sharded servers, S = 1, 2, 4, 8");
  f.add("codecs", "dense;topk:k=5000;sketch:rows=1,cols=25000,k=5000,fetch=1",
        "codec specs, separated by ';'");
  f.add("dim", "100000", "d");
  f.add("workers", "64", "W");
  f.add("shards", "1,2,4,8", "S values");
  f.add("warm", "2", "warm-up rounds (not measured)");
  f.add("rounds", "8", "measured rounds (median reported)");
  f.add("launch", "",
        "command prefix of shard {i}'s server, words separated by spaces ({i+1}: the index + 1)");
  f.add("bind", "tcp://127.0.0.1:*", "shard {i}'s endpoint to bind ({i}, {i+1} as in --launch)");
  f.add("heartbeat-ms", "2000",
        "liveness interval: a worker reconnects after 3 silent ones, so on slow links it must "
        "exceed a third of the longest wait for an update");
  f.add("backup-launch", "",
        "with --replicas: shard {i}'s backup's command prefix (default: --launch)");
  f.add("backup-bind", "", "with --replicas: shard {i}'s backup's endpoint (default: --bind)");
  f.add("replicas", "0", "0: no backups; 1: a backup per shard; 0,1: both, one after the other");
  f.add("failover", "0",
        "with a backup: kill shard 0's primary before a round half-way and time that round", "",
        true);
  f.add("label", "loopback", "what the links are, for the JSON lines");
  f.add("out", "", "append JSON lines here");
  f.add("server", "", "the sketchsgd-server program (default: beside this one, ../server/)");
  try {
    if (!f.parse(argc, argv)) return 0;
    std::ofstream out;
    if (!f.str("out").empty()) out.open(f.str("out"), std::ios::app);
    const std::string server_bin = bench::server_program(f.str("server"), argv[0]);
    const auto words = [&](const std::string& flag) {
      std::vector<std::string> v;
      std::stringstream in(f.str(flag));
      for (std::string w; in >> w;) v.push_back(w);
      return v;
    };
    const auto launch = words("launch");
    const auto backup_launch = f.str("backup-launch").empty() ? launch : words("backup-launch");
    const std::string backup_bind =
        f.str("backup-bind").empty() ? f.str("bind") : f.str("backup-bind");
    const auto tmp = std::filesystem::temp_directory_path() /
                     ("sketchsgd-bench-shards-" + std::to_string(::getpid()));
    std::filesystem::create_directories(tmp);
    const Setup st{server_bin,
                   launch,
                   backup_launch,
                   f.str("bind"),
                   backup_bind,
                   f.u64("dim"),
                   uint32_t(f.u64("workers", 1, 4096)),
                   int(f.u64("warm", 0, 1000)),
                   int(f.u64("rounds", 1, 100000)),
                   f.u64("heartbeat-ms", 1, 3600000),
                   tmp};
    const uint64_t d = st.d;
    const auto world = st.world;
    std::vector<bool> replica_runs;
    std::stringstream rs(f.str("replicas"));
    for (std::string v; std::getline(rs, v, ',');) {
      if (v != "0" && v != "1") throw InvalidArgument("--replicas: 0, 1 or 0,1, got '" + v + "'");
      replica_runs.push_back(v == "1");
    }
    const bool failover = f.on("failover");
    if (failover && std::find(replica_runs.begin(), replica_runs.end(), true) == replica_runs.end())
      throw InvalidArgument("--failover needs --replicas 1");
    if (failover && st.rounds < 3) throw InvalidArgument("--failover needs --rounds 3 or more");
    std::printf("%-44s %3s %3s %10s %8s %12s %11s %11s %11s %11s\n", "codec", "S", "rep",
                "round_ms", "speedup", "link_MB/rnd", "cpu_ms_sum", "cpu_ms_max", "rss_MB_sum",
                "failover_ms");
    std::stringstream codecs(f.str("codecs"));
    for (std::string spec; std::getline(codecs, spec, ';');) {
      double base = 0;
      std::stringstream ss(f.str("shards"));
      for (std::string s; std::getline(ss, s, ',');) {
        const auto shards = uint32_t(std::stoul(s));
        for (const bool replicas : replica_runs) {
          const Result r = run(st, spec, shards, replicas, failover && replicas);
          if (shards == 1 && !replicas) base = r.round_ms;
          std::printf("%-44s %3u %3d %10.1f %8.2f %12.2f %11.1f %11.1f %11.1f %11.1f\n",
                      spec.c_str(), shards, int(replicas), r.round_ms,
                      base > 0 ? base / r.round_ms : 0.0, r.link_mb, r.cpu_ms_sum, r.cpu_ms_max,
                      r.rss_mb_sum, r.failover_ms);
          std::fflush(stdout);
          if (out)
            out << "{\"links\":\"" << f.str("label") << "\",\"spec\":\"" << spec << "\",\"d\":" << d
                << ",\"workers\":" << world << ",\"shards\":" << shards
                << ",\"replicas\":" << int(replicas) << ",\"rounds\":" << f.u64("rounds")
                << ",\"round_ms\":" << r.round_ms << ",\"link_mb\":" << r.link_mb
                << ",\"server_cpu_ms_sum\":" << r.cpu_ms_sum
                << ",\"server_cpu_ms_max\":" << r.cpu_ms_max << ",\"rss_mb_sum\":" << r.rss_mb_sum
                << ",\"rss_mb_max\":" << r.rss_mb_max << ",\"failover_ms\":" << r.failover_ms
                << ",\"heartbeat_ms\":" << st.heartbeat_ms << "}\n"
                << std::flush;
        }
      }
    }
    std::filesystem::remove_all(tmp);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sketchsgd_bench_shards: %s\n", e.what());
    return 2;
  }
}
