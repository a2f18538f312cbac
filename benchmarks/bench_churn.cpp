// sketchsgd_bench_churn: federated rounds (C clients sampled from N, each connecting, registering,
// getting the model, pushing and leaving) against rounds of C fixed workers, in one run.
//
// The server is a sketchsgd-server process; the clients are threads of this one (TCP on
// 127.0.0.1), every one pushing the same synthetic gradient. A federated client does everything
// a participant does: a new socket, Hello, Welcome and the model (the whole of it: a stateless
// client has none), Push, the Update; then it leaves (socket closed). Its clients check in when
// their round starts (--check-in round), or while the round before runs (ahead), as the server
// allows, so that the connection and registration are off the round's path. Round time: from the
// end of the round before (its last client has the update) to the end of this one, so every
// cost of a round counts whether or not it overlaps another. join_ms and leave_ms time a
// client's arrival (until it holds the model; ahead, waiting for its round included) and its
// leaving. --work-ms adds a device's local work (computing its gradient) as a sleep before each
// push: devices compute side by side, so that time uses none of this machine's cores. The
// server's own cost: its CPU time per round and its resident memory after the
// warm-up rounds and before the last round, from /proc; the clients' (this process's CPU per
// client and round) shows what the devices would spend. Unlike real devices, the clients here
// share this machine's cores with each other and with the server, so their work adds up instead
// of running side by side; with --io shared (the default) they share one ZeroMQ context too
// (ClientOptions::shared_io), as a device's network stack is already running when it is
// sampled, instead of starting two threads each.
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
  double client_cpu_ms = 0;  ///< this process's CPU a client (or worker) and round
  uint64_t registrations = 0;
};

/// How a run's clients come: fixed workers (population 0), federated clients that connect when
/// their round starts, or federated clients that check in while the round before runs.
enum class Arrival { Fixed, WithRound, Ahead };

/// One run: the server, the clients' threads and the measured rounds.
class Run {
 public:
  Run(const std::string& server_bin, const std::string& spec, uint64_t d, uint32_t per_round,
      uint32_t population, int warm, int rounds, bool shared_io, std::chrono::milliseconds work)
      : spec_(spec),
        d_(d),
        per_round_(per_round),
        population_(population),
        warm_(warm),
        total_(warm + rounds),
        shared_io_(shared_io),
        work_(work),
        server_(demo::Process::spawn(
            {server_bin, "--bind", "tcp://127.0.0.1:*", "--world", std::to_string(per_round),
             "--population", std::to_string(population), "--dim", std::to_string(d), "--codec",
             spec, "--lr", "0.01", "--rounds", std::to_string(warm + rounds), "--finish-grace-ms",
             "100", "--quiet"})),
        g_(bench::xorshift_gradient(d)),
        init_(d, 0.0f),
        done_(per_round, std::vector<Clock::time_point>(total_)),
        join_(per_round, std::vector<double>(total_)),
        leave_(per_round, std::vector<double>(total_)),
        finished_(total_) {
    endpoint_ = server_.line(std::chrono::seconds(30));
    if (endpoint_.rfind("tcp://", 0) != 0) throw std::runtime_error("the server did not start");
  }

  Result go(Arrival how) {
    std::vector<std::thread> ts;
    if (how == Arrival::Ahead) {
      // Two threads a slot (even and odd rounds): round r + 1's client checks in while round r's
      // pushes.
      for (uint32_t slot = 0; slot < per_round_; ++slot)
        for (int parity = 0; parity < 2; ++parity)
          ts.emplace_back([this, slot, parity] {
            for (int r = parity; r < total_; r += 2) {
              opened_.wait_for(r - 1);  // the server takes check-ins one round ahead
              auto client = join(slot, r);
              opened_.reach(r);
              step(slot, r, std::move(client));
            }
          });
    } else {
      for (uint32_t slot = 0; slot < per_round_; ++slot)
        ts.emplace_back([this, slot, how] {
          std::unique_ptr<Client> fixed;
          if (how == Arrival::Fixed) fixed = join(slot, 0);
          for (int r = 0; r < total_; ++r) {
            started_.wait_for(r);  // the round starts
            if (fixed) {
              std::this_thread::sleep_for(work_);
              fixed->step(g_);
              done_[slot][r] = Clock::now();
              completed(r);
            } else {
              step(slot, r, join(slot, r));
            }
          }
        });
    }
    Result res;
    double cpu0 = 0, own0 = 0;
    for (int r = 0; r < total_; ++r) {
      if (r == warm_) {
        res.rss_start = rss_mb(server_.pid());
        cpu0 = cpu_ms(server_.pid());
        own0 = cpu_ms(getpid());
      }
      if (r == total_ - 1) {  // the server may be gone once the last round has ended
        res.rss_end = rss_mb(server_.pid());
        res.server_cpu_ms = (cpu_ms(server_.pid()) - cpu0) / (total_ - 1 - warm_);
        res.client_cpu_ms = (cpu_ms(getpid()) - own0) / ((total_ - 1 - warm_) * per_round_);
      }
      started_.reach(r);
      ended_.wait_for(r);  // every client has its update (and, but ahead, has left)
    }
    for (auto& t : ts) t.join();
    if (const int rc = server_.wait(std::chrono::seconds(30)); rc != 0)
      throw std::runtime_error("the server exited with " + std::to_string(rc));
    // A round's time: from the end of the round before (its last client's update) to the end of
    // this one, so whatever a round's clients do before their push counts, overlapped or not.
    std::vector<double> round_ms, join_ms, leave_ms;
    auto last = [&](int r) {
      Clock::time_point t{};
      for (uint32_t s = 0; s < per_round_; ++s) t = std::max(t, done_[s][r]);
      return t;
    };
    for (int r = std::max(warm_, 1); r < total_; ++r) {
      round_ms.push_back(ms(last(r) - last(r - 1)));
      for (uint32_t s = 0; s < per_round_; ++s) {
        join_ms.push_back(join_[s][r]);
        leave_ms.push_back(leave_[s][r]);
      }
    }
    res.round_ms = median(round_ms);
    res.join_ms = how == Arrival::Fixed ? 0 : median(join_ms);
    res.leave_ms = how == Arrival::Fixed ? 0 : median(leave_ms);
    res.registrations = registrations_;
    return res;
  }

 private:
  /// A round number every thread may wait for: reach(r) wakes those waiting for r or less.
  struct Mark {
    void reach(int r) {
      int seen = at.load();
      while (seen < r && !at.compare_exchange_weak(seen, r)) {
      }
      at.notify_all();
    }
    void wait_for(int r) {
      for (int seen = at.load(); seen < r; seen = at.load()) at.wait(seen);
    }
    std::atomic<int> at{-1};
  };

  ClientOptions options(uint32_t id) const {
    ClientOptions c;
    c.server = endpoint_;
    c.rank = id;
    c.world = per_round_;
    c.population = population_;
    c.shared_io = shared_io_;
    c.log = [](const std::string&) {};
    return c;
  }

  /// The slot's client of round r (a fixed worker: r = 0), registered and holding the model.
  /// join_ms: a federated client's connecting, registering and downloading, waiting for its round
  /// to open included when it checked in ahead.
  std::unique_ptr<Client> join(uint32_t slot, int r) {
    ClientOptions c = options(slot);
    if (population_) {
      c.rank = sample_clients(population_, per_round_, 1, uint64_t(r))[slot];
      c.join_round = uint64_t(r);
    }
    const auto t0 = Clock::now();
    const bool first = r == 0 && (population_ || slot == 0);
    auto client =
        std::make_unique<Client>(c, make_compressor(spec_, d_),
                                 first ? std::span<const float>(init_) : std::span<const float>());
    join_[slot][r] = ms(Clock::now() - t0);
    ++registrations_;
    return client;
  }

  /// A federated client's round: push, the update, leave.
  void step(uint32_t slot, int r, std::unique_ptr<Client> client) {
    std::this_thread::sleep_for(work_);
    client->step(g_);
    done_[slot][r] = Clock::now();
    client.reset();
    leave_[slot][r] = ms(Clock::now() - done_[slot][r]);
    completed(r);
  }

  void completed(int r) {
    if (++finished_[r] == per_round_) ended_.reach(r);
  }

  std::string spec_;
  uint64_t d_;
  uint32_t per_round_, population_;
  int warm_, total_;
  bool shared_io_;
  std::chrono::milliseconds work_;  // a device's local work between the model and its push
  demo::Process server_;
  std::string endpoint_;
  std::vector<float> g_, init_;
  std::vector<std::vector<Clock::time_point>> done_;
  std::vector<std::vector<double>> join_, leave_;
  std::vector<std::atomic<uint32_t>> finished_;  // clients done with round r
  std::atomic<uint64_t> registrations_{0};
  Mark started_, ended_, opened_;
};

}  // namespace

int main(int argc, char** argv) {
  Flags f("sketchsgd_bench_churn: federated rounds (clients that come and go) vs fixed workers");
  f.add("codec", "sketch:rows=1,cols=20000,k=4000,fetch=1", "codec spec");
  f.add("dims", "100000,1000000", "d values");
  f.add("per-round", "100", "C: clients a round (and the fixed workers compared with)");
  f.add("population", "1000", "N: the federated job's clients");
  f.add("warm", "2", "warm-up rounds (not measured; at least 1)");
  f.add("rounds", "20", "measured rounds (median reported)");
  f.add("out", "", "append JSON lines here");
  f.add("server", "", "the sketchsgd-server program (default: beside this one, ../server/)");
  f.add("io", "shared", "shared: the clients share one ZeroMQ context; own: a context each");
  f.add("work-ms", "0",
        "each client's (and worker's) local work between getting the model and pushing, as a "
        "sleep: devices compute side by side, which this machine's cores cannot emulate");
  f.add("check-in", "ahead,round",
        "when federated clients come, one run each: ahead (while the round before runs), round "
        "(when their round starts)");
  try {
    if (!f.parse(argc, argv)) return 0;
    std::ofstream out;
    if (!f.str("out").empty()) out.open(f.str("out"), std::ios::app);
    const auto c = uint32_t(f.u64("per-round")), n = uint32_t(f.u64("population"));
    const int warm = int(f.u64("warm")), rounds = int(f.u64("rounds"));
    if (warm < 1 || rounds < 2)
      throw std::invalid_argument("--warm: at least 1, --rounds: at least 2");
    const std::string server_bin = bench::server_program(f.str("server"), argv[0]);
    if (f.str("io") != "shared" && f.str("io") != "own")
      throw std::invalid_argument("--io: shared or own, not '" + f.str("io") + "'");
    const bool shared_io = f.str("io") == "shared";
    const std::chrono::milliseconds work(f.u64("work-ms"));
    std::vector<std::string> arrivals;
    std::stringstream modes(f.str("check-in"));
    for (std::string m; std::getline(modes, m, ',');) {
      if (m != "ahead" && m != "round")
        throw std::invalid_argument("--check-in: ahead or round, not '" + m + "'");
      arrivals.push_back(m);
    }
    std::printf("%10s %5s %6s %8s %10s %12s %7s %9s %9s %11s %11s %11s %11s %10s %10s\n", "d", "C",
                "N", "check_in", "fixed_ms", "federated_ms", "ratio", "join_ms", "leave_ms",
                "srv_cpu_fix", "srv_cpu_fed", "cli_cpu_fix", "cli_cpu_fed", "rss_start", "rss_end");
    std::stringstream dims(f.str("dims"));
    for (std::string ds; std::getline(dims, ds, ',');) {
      const uint64_t d = std::stoull(ds);
      const std::string spec = f.str("codec");
      const Result fixed =
          Run(server_bin, spec, d, c, 0, warm, rounds, shared_io, work).go(Arrival::Fixed);
      for (const auto& mode : arrivals) {
        const Result fed = Run(server_bin, spec, d, c, n, warm, rounds, shared_io, work)
                               .go(mode == "ahead" ? Arrival::Ahead : Arrival::WithRound);
        std::printf(
            "%10llu %5u %6u %8s %10.1f %12.1f %7.2f %9.1f %9.1f %11.1f %11.1f %11.2f %11.2f %10.1f "
            "%10.1f\n",
            (unsigned long long)d, c, n, mode.c_str(), fixed.round_ms, fed.round_ms,
            fed.round_ms / fixed.round_ms, fed.join_ms, fed.leave_ms, fixed.server_cpu_ms,
            fed.server_cpu_ms, fixed.client_cpu_ms, fed.client_cpu_ms, fed.rss_start, fed.rss_end);
        std::fflush(stdout);
        if (out)
          out << "{\"spec\":\"" << spec << "\",\"io\":\"" << f.str("io") << "\",\"check_in\":\""
              << mode << "\",\"d\":" << d << ",\"per_round\":" << c << ",\"population\":" << n
              << ",\"rounds\":" << rounds << ",\"warm\":" << warm << ",\"work_ms\":" << work.count()
              << ",\"fixed_ms\":" << fixed.round_ms << ",\"federated_ms\":" << fed.round_ms
              << ",\"join_ms\":" << fed.join_ms << ",\"leave_ms\":" << fed.leave_ms
              << ",\"server_cpu_ms_fixed\":" << fixed.server_cpu_ms
              << ",\"server_cpu_ms_federated\":" << fed.server_cpu_ms
              << ",\"client_cpu_ms_fixed\":" << fixed.client_cpu_ms
              << ",\"client_cpu_ms_federated\":" << fed.client_cpu_ms
              << ",\"registrations\":" << fed.registrations << ",\"rss_start_mb\":" << fed.rss_start
              << ",\"rss_end_mb\":" << fed.rss_end << ",\"fixed_rss_start_mb\":" << fixed.rss_start
              << ",\"fixed_rss_end_mb\":" << fixed.rss_end << "}\n"
              << std::flush;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sketchsgd_bench_churn: %s\n", e.what());
    return 2;
  }
}
