// sketchsgd_bench_churn: a federated round (C clients sampled from N, each connecting, registering,
// pulling the model, pushing and leaving) against a round of C fixed workers, in one run.
//
// The server is a sketchsgd-server process; the clients are threads of this one (TCP on
// 127.0.0.1), every one pushing the same synthetic gradient. Round time: from the moment the
// round's clients (or workers) start to the moment the last of them has applied the update. A
// federated client does everything a participant does: a new socket, Hello, Welcome, Pull (the
// whole model: a stateless client has none), Push, the Update; then it leaves (Bye, socket and
// threads closed), timed apart (leave_ms) because a real device leaves on its own time. The
// server's own cost: its CPU time per round and its resident memory after the warm-up rounds
// and after the last round, from /proc. Unlike real devices, the clients here share this
// machine's cores with each other and with the server; with --io shared (the default) they share
// one ZeroMQ context too (ClientOptions::shared_io), as a device's network stack is already
// running when it is sampled, instead of starting two threads each.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/worker/client.hpp>
#include "demo/process.hpp"
#include "rounds.hpp"

namespace {

using namespace sketchsgd;
using namespace sketchsgd::ps;
using bench::Clock;
using bench::cpu_ms;
using bench::median;
using bench::ms;
using bench::rss_mb;

struct Result {
  double round_ms = 0, join_ms = 0, leave_ms = 0, server_cpu_ms = 0, rss_start = 0, rss_end = 0;
  uint64_t registrations = 0;
};

/// `rounds` measured rounds after `warm` warm-up rounds; population 0: fixed workers.
Result run(const std::string& server_bin, const std::string& spec, uint64_t d, uint32_t per_round,
           uint32_t population, int warm, int rounds, bool shared_io) {
  auto server =
      demo::Process::spawn({server_bin, "--bind", "tcp://127.0.0.1:*", "--world",
                            std::to_string(per_round), "--population", std::to_string(population),
                            "--dim", std::to_string(d), "--codec", spec, "--lr", "0.01", "--rounds",
                            std::to_string(warm + rounds), "--finish-grace-ms", "100", "--quiet"});
  const std::string endpoint = server.line(std::chrono::seconds(30));
  if (endpoint.rfind("tcp://", 0) != 0) throw std::runtime_error("the server did not start");

  const auto g = bench::xorshift_gradient(d);
  const std::vector<float> init(d, 0.0f);
  const int total = warm + rounds;
  std::barrier sync(per_round + 1);
  std::vector<std::vector<Clock::time_point>> done(per_round,
                                                   std::vector<Clock::time_point>(total));
  std::vector<std::vector<double>> join(per_round, std::vector<double>(total));
  std::vector<std::vector<double>> leave(per_round, std::vector<double>(total));
  std::atomic<uint64_t> registrations{0};
  std::vector<Clock::time_point> start(total);
  std::vector<std::thread> ts;
  auto options = [&](uint32_t id) {
    ClientOptions c;
    c.server = endpoint;
    c.rank = id;
    c.world = per_round;
    c.population = population;
    c.shared_io = shared_io;
    c.log = [](const std::string&) {};
    return c;
  };
  for (uint32_t slot = 0; slot < per_round; ++slot)
    ts.emplace_back([&, slot] {
      std::unique_ptr<Client> fixed;
      if (!population) {
        fixed = std::make_unique<Client>(
            options(slot), make_compressor(spec, d),
            slot == 0 ? std::span<const float>(init) : std::span<const float>());
        ++registrations;
      }
      for (int r = 0; r < total; ++r) {
        sync.arrive_and_wait();  // the round starts
        if (fixed) {
          fixed->step(g);
        } else {
          const auto who = sample_clients(population, per_round, 1, uint64_t(r));
          ClientOptions c = options(who[slot]);
          c.join_round = uint64_t(r);
          const auto t0 = Clock::now();
          auto client = std::make_unique<Client>(
              c, make_compressor(spec, d),
              r == 0 ? std::span<const float>(init) : std::span<const float>());
          join[slot][r] = ms(Clock::now() - t0);
          ++registrations;
          client->step(g);
          done[slot][r] = Clock::now();
          client.reset();
          leave[slot][r] = ms(Clock::now() - done[slot][r]);
          sync.arrive_and_wait();  // every client has its update and has left
          continue;
        }
        done[slot][r] = Clock::now();
        sync.arrive_and_wait();  // every worker has its update
      }
    });
  std::vector<double> round_ms, join_ms, leave_ms;
  Result res;
  double cpu0 = 0;
  for (int r = 0; r < total; ++r) {
    if (r == warm) {
      res.rss_start = rss_mb(server.pid());
      cpu0 = cpu_ms(server.pid());
    }
    start[r] = Clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    if (r < warm) continue;
    Clock::time_point last{};
    for (uint32_t s = 0; s < per_round; ++s) {
      last = std::max(last, done[s][r]);
      join_ms.push_back(join[s][r]);
      leave_ms.push_back(leave[s][r]);
    }
    round_ms.push_back(ms(last - start[r]));
  }
  res.rss_end = rss_mb(server.pid());
  res.server_cpu_ms = (cpu_ms(server.pid()) - cpu0) / rounds;
  for (auto& t : ts) t.join();
  if (const int rc = server.wait(std::chrono::seconds(30)); rc != 0)
    throw std::runtime_error("the server exited with " + std::to_string(rc));
  res.round_ms = median(round_ms);
  res.join_ms = population ? median(join_ms) : 0;
  res.leave_ms = population ? median(leave_ms) : 0;
  res.registrations = registrations;
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f("sketchsgd_bench_churn: federated rounds (clients that come and go) vs fixed workers");
  f.add("codec", "sketch:rows=1,cols=20000,k=4000,fetch=1", "codec spec");
  f.add("dims", "100000,1000000", "d values");
  f.add("per-round", "100", "C: clients a round (and the fixed workers compared with)");
  f.add("population", "1000", "N: the federated job's clients");
  f.add("warm", "2", "warm-up rounds (not measured)");
  f.add("rounds", "20", "measured rounds (median reported)");
  f.add("out", "", "append JSON lines here");
  f.add("server", "", "the sketchsgd-server program (default: beside this one, ../server/)");
  f.add("io", "shared", "shared: the clients share one ZeroMQ context; own: a context each");
  try {
    if (!f.parse(argc, argv)) return 0;
    std::ofstream out;
    if (!f.str("out").empty()) out.open(f.str("out"), std::ios::app);
    const auto c = uint32_t(f.u64("per-round")), n = uint32_t(f.u64("population"));
    const int warm = int(f.u64("warm")), rounds = int(f.u64("rounds"));
    const std::string server_bin = bench::server_program(f.str("server"), argv[0]);
    if (f.str("io") != "shared" && f.str("io") != "own")
      throw std::invalid_argument("--io: shared or own, not '" + f.str("io") + "'");
    const bool shared_io = f.str("io") == "shared";
    std::printf("%10s %5s %6s %10s %12s %7s %9s %9s %11s %11s %10s %10s\n", "d", "C", "N",
                "fixed_ms", "federated_ms", "ratio", "join_ms", "leave_ms", "srv_cpu_fix",
                "srv_cpu_fed", "rss_start", "rss_end");
    std::stringstream dims(f.str("dims"));
    for (std::string ds; std::getline(dims, ds, ',');) {
      const uint64_t d = std::stoull(ds);
      const std::string spec = f.str("codec");
      const Result fixed = run(server_bin, spec, d, c, 0, warm, rounds, shared_io);
      const Result fed = run(server_bin, spec, d, c, n, warm, rounds, shared_io);
      std::printf("%10llu %5u %6u %10.1f %12.1f %7.2f %9.1f %9.1f %11.1f %11.1f %10.1f %10.1f\n",
                  (unsigned long long)d, c, n, fixed.round_ms, fed.round_ms,
                  fed.round_ms / fixed.round_ms, fed.join_ms, fed.leave_ms, fixed.server_cpu_ms,
                  fed.server_cpu_ms, fed.rss_start, fed.rss_end);
      std::fflush(stdout);
      if (out)
        out << "{\"spec\":\"" << spec << "\",\"io\":\"" << f.str("io") << "\",\"d\":" << d
            << ",\"per_round\":" << c << ",\"population\":" << n << ",\"rounds\":" << rounds
            << ",\"warm\":" << warm << ",\"fixed_ms\":" << fixed.round_ms
            << ",\"federated_ms\":" << fed.round_ms << ",\"join_ms\":" << fed.join_ms
            << ",\"leave_ms\":" << fed.leave_ms
            << ",\"server_cpu_ms_fixed\":" << fixed.server_cpu_ms
            << ",\"server_cpu_ms_federated\":" << fed.server_cpu_ms
            << ",\"registrations\":" << fed.registrations << ",\"rss_start_mb\":" << fed.rss_start
            << ",\"rss_end_mb\":" << fed.rss_end << ",\"fixed_rss_start_mb\":" << fixed.rss_start
            << ",\"fixed_rss_end_mb\":" << fixed.rss_end << "}\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sketchsgd_bench_churn: %s\n", e.what());
    return 2;
  }
}
