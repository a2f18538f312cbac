// sketchsgd_bench_flood: what a flood of Follow requests from peers that are not the backup costs
// a replicated primary (no CURVE: anyone who reaches the port may send one).
//
// A sketchsgd-server primary and its backup (processes, 127.0.0.1) and two worker threads run
// rounds; after the warm-up, `--rounds` quiet rounds, then `--rounds` rounds while a thread sends
// `--follows` valid Follows of the job from `--connections` sockets, as fast as ZeroMQ takes them.
// Reported: the median round time of each phase and their ratio, the primary's CPU a round and its
// resident memory at the start and end of each phase (from /proc), and whether the job ended on
// the primary (the flood took no backup's role and deposed nothing).
//
// `--flood-cpu N` keeps the flood on CPU N and the job (servers, workers) off it: on a small
// machine a flooding thread sharing the job's cores slows the rounds by taking their CPU, which a
// flood from another host would not; pinned, the ratio measures what serving the flood costs.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/ps/transport.hpp>
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

constexpr uint64_t kJob = 7;

struct Phase {
  double round_ms = 0, cpu_ms_round = 0, rss_start = 0, rss_end = 0;
};

/// Keeps this process (and the servers it spawns after) off `cpu`.
void avoid_cpu(int cpu) {
  cpu_set_t all;
  if (sched_getaffinity(0, sizeof all, &all) != 0 || !CPU_ISSET(cpu, &all) || CPU_COUNT(&all) < 2)
    throw std::invalid_argument("--flood-cpu " + std::to_string(cpu) +
                                ": not one of this process's CPUs, or the only one");
  CPU_CLR(cpu, &all);
  if (sched_setaffinity(0, sizeof all, &all) != 0)
    throw std::runtime_error("cannot keep the job off CPU " + std::to_string(cpu));
}

/// Sends `n` Follows (from CPU `cpu` alone when it is not negative) of the job (epoch 0, the job's
/// own description) from `conns` sockets.
uint64_t flood(const std::string& endpoint, const std::string& spec, uint64_t dim, uint64_t n,
               int conns, int cpu) {
  if (cpu >= 0) {  // before the context: its I/O thread inherits this thread's CPUs
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0)
      throw std::runtime_error("cannot pin the flood to CPU " + std::to_string(cpu));
  }
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> socks;
  for (int i = 0; i < conns; ++i) {
    socks.emplace_back(ctx, zmq::socket_type::dealer);
    socks.back().set(zmq::sockopt::linger, 0);
    socks.back().connect(endpoint);
  }
  const Bytes env = encode(Envelope{Type::Follow, kJob, 0, 0, 0});
  const Bytes hello = encode(HelloInfo{2, dim, spec, 0, ShardId{0, 1, 0, dim}, 0});
  uint64_t sent = 0;
  for (uint64_t i = 0; i < n; ++i) {
    auto& s = socks[i % socks.size()];
    zmq::message_t a(env.data(), env.size()), b(hello.data(), hello.size());
    if (s.send(a, zmq::send_flags::sndmore) && s.send(b, zmq::send_flags::none)) ++sent;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // delivered before the close
  return sent;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f("sketchsgd_bench_flood: a replicated primary's rounds under a flood of Follows");
  f.add("codec", "topk:k=10000", "codec spec");
  f.add("dim", "1000000", "d");
  f.add("warm", "3", "warm-up rounds (not measured; at least 1)");
  f.add("rounds", "30", "measured rounds a phase (at least 2; median reported)");
  f.add("follows", "10000", "Follow requests the flood sends");
  f.add("connections", "16", "sockets the flood sends them from");
  f.add("flood-cpu", "",
        "pin the flood to this CPU and the job to the others (default: no pinning)");
  f.add("out", "", "append a JSON line here");
  f.add("server", "", "the sketchsgd-server program (default: beside this one, ../server/)");
  try {
    if (!f.parse(argc, argv)) return 0;
    const uint64_t d = f.u64("dim"), follows = f.u64("follows");
    const int warm = int(f.u64("warm")), rounds = int(f.u64("rounds"));
    const int conns = int(f.u64("connections"));
    const int flood_cpu =
        f.str("flood-cpu").empty() ? -1 : int(f.u64("flood-cpu", 0, CPU_SETSIZE - 1));
    if (warm < 1 || rounds < 2 || d == 0 || conns < 1 || conns > 1024)
      throw std::invalid_argument(
          "--warm at least 1, --rounds at least 2, --dim above 0, --connections in [1, 1024]");
    if (flood_cpu >= 0) avoid_cpu(flood_cpu);  // before the servers start: they inherit it
    const std::string spec = make_compressor(f.str("codec"), d)->spec();
    const std::string bin = bench::server_program(f.str("server"), argv[0]);
    const int total = warm + 2 * rounds;
    const std::vector<std::string> job{bin,
                                       "--bind",
                                       "tcp://127.0.0.1:*",
                                       "--job",
                                       std::to_string(kJob),
                                       "--world",
                                       "2",
                                       "--dim",
                                       std::to_string(d),
                                       "--codec",
                                       spec,
                                       "--lr",
                                       "0.01",
                                       "--rounds",
                                       std::to_string(total),
                                       "--finish-grace-ms",
                                       "100",
                                       "--quiet"};
    demo::Process primary = demo::Process::spawn(job);
    const std::string pe = primary.line(std::chrono::seconds(30));
    if (pe.rfind("tcp://", 0) != 0) throw std::runtime_error("the primary did not start");
    std::vector<std::string> bjob = job;
    bjob.insert(bjob.end(), {"--replica-of", pe});
    demo::Process backup = demo::Process::spawn(bjob);
    const std::string be = backup.line(std::chrono::seconds(30));
    if (be.rfind("tcp://", 0) != 0) throw std::runtime_error("the backup did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it follows

    const auto g = bench::xorshift_gradient(d);
    const std::vector<float> init(d, 0.0f);
    std::vector<Clock::time_point> ended(total);
    std::atomic<int> failures{0};
    std::vector<std::thread> ws;
    for (uint32_t r = 0; r < 2; ++r)
      ws.emplace_back([&, r] {
        try {
          ClientOptions o;
          o.server = pe + "|" + be;
          o.job = kJob;
          o.rank = r;
          o.world = 2;
          o.timeout = std::chrono::seconds(60);
          Client c(o, make_compressor(spec, d),
                   r == 0 ? std::span<const float>(init) : std::span<const float>());
          for (int t = 0; t < total; ++t) {
            if (c.step(g).outcome != StepResult::Outcome::Updated) ++failures;
            if (r == 0) ended[t] = Clock::now();
          }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "worker %u: %s\n", r, e.what());
          ++failures;
        }
      });
    // The phases, read off rank 0's round ends (a round's time: from the end of the one before).
    Phase quiet, flooded;
    const auto wait_round = [&](int t) {
      while (ended[t] == Clock::time_point{} && failures == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    };
    wait_round(warm - 1);
    quiet.rss_start = rss_mb(primary.pid());
    double cpu0 = cpu_ms(primary.pid());
    wait_round(warm + rounds - 1);
    quiet.rss_end = flooded.rss_start = rss_mb(primary.pid());
    double cpu1 = cpu_ms(primary.pid());
    quiet.cpu_ms_round = (cpu1 - cpu0) / rounds;
    uint64_t sent = 0;
    std::thread flooder([&] { sent = flood(pe, spec, d, follows, conns, flood_cpu); });
    wait_round(total - 2);  // the primary may be gone once the last round has ended
    flooded.rss_end = rss_mb(primary.pid());
    flooded.cpu_ms_round = (cpu_ms(primary.pid()) - cpu1) / (rounds - 1);
    flooder.join();
    for (auto& t : ws) t.join();
    const int prc = primary.wait(std::chrono::seconds(30));
    backup.kill9();
    if (failures) throw std::runtime_error("a worker's round failed");
    const auto phase_ms = [&](int from, int to) {
      std::vector<double> v;
      for (int t = from; t < to; ++t) v.push_back(ms(ended[t] - ended[t - 1]));
      return median(v);
    };
    quiet.round_ms = phase_ms(warm, warm + rounds);
    flooded.round_ms = phase_ms(warm + rounds, total);
    std::printf("%10s %8s %8s %10s %11s %8s %12s %12s %12s %12s %9s\n", "d", "follows", "sent",
                "quiet_ms", "flooded_ms", "ratio", "cpu_quiet", "cpu_flooded", "rss_quiet",
                "rss_flooded", "primary");
    std::printf(
        "%10llu %8llu %8llu %10.2f %11.2f %8.2f %12.2f %12.2f %5.1f->%5.1f %5.1f->%5.1f %9s\n",
        (unsigned long long)d, (unsigned long long)follows, (unsigned long long)sent,
        quiet.round_ms, flooded.round_ms, flooded.round_ms / quiet.round_ms, quiet.cpu_ms_round,
        flooded.cpu_ms_round, quiet.rss_start, quiet.rss_end, flooded.rss_start, flooded.rss_end,
        prc == 0 ? "finished" : "EXITED");
    if (!f.str("out").empty()) {
      std::ofstream out(f.str("out"), std::ios::app);
      out << "{\"spec\":\"" << spec << "\",\"d\":" << d << ",\"rounds\":" << rounds
          << ",\"follows\":" << follows << ",\"sent\":" << sent << ",\"connections\":" << conns
          << ",\"flood_cpu\":" << flood_cpu << ",\"quiet_ms\":" << quiet.round_ms
          << ",\"flooded_ms\":" << flooded.round_ms
          << ",\"cpu_ms_round_quiet\":" << quiet.cpu_ms_round
          << ",\"cpu_ms_round_flooded\":" << flooded.cpu_ms_round << ",\"rss_mb\":["
          << quiet.rss_start << "," << quiet.rss_end << "," << flooded.rss_start << ","
          << flooded.rss_end << "],\"primary_exit\":" << prc << "}\n";
    }
    return prc == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sketchsgd_bench_flood: %s\n", e.what());
    return 2;
  }
}
