// sketchsgd_bench_ps: parameter-server rounds on 127.0.0.1 versus the loopback floor, in one run.
//
// For each (codec, d, W): a Server and W worker Clients (threads of this process, TCP on
// loopback) run rounds with a fixed gradient. Round cost = from the moment the last worker handed
// its push to the socket to the moment the last worker applied the update: transfer up, merge,
// reduce, transfer down, apply. The floor is the same measure for raw ZeroMQ moving messages of
// the same sizes (W pushes in, one update out to each) with no work at all. Prints a table and
// writes JSON lines (--out) for scripts/plot_ps.py.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/server.hpp>
#include <sketchsgd/worker/client.hpp>
#include "rounds.hpp"

namespace {

using namespace sketchsgd;
using namespace sketchsgd::ps;
using bench::Clock;
using bench::median;
using bench::ms;

std::vector<uint64_t> list(const std::string& s) {
  std::vector<uint64_t> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoull(x));
  return v;
}

std::string spec_for(const std::string& codec, uint64_t d) {
  const uint64_t k =
      std::max<uint64_t>(16, d / 160);                // d = 16M: k = 100k, c = 1M (the target case)
  if (codec == "sketch" || codec == "sketch-random")  // blocked hashing (the default) or random
    return "sketch:rows=5,cols=" + std::to_string(10 * k) + ",k=" + std::to_string(k) +
           (codec == "sketch" ? "" : ",hashing=random");
  if (codec == "topk") return "topk:k=" + std::to_string(k);
  return codec;
}

struct Result {
  double round_ms, floor_ms, encode_ms, merge_ms;
  uint64_t up_each, down_each;
};

/// Raw ZeroMQ: W dealers each send `up` bytes; the router sends `down` bytes back to each.
double loopback_floor(uint32_t world, size_t up, size_t down, int rounds) {
  zmq::context_t ctx(2);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  const std::string ep = router.get(zmq::sockopt::last_endpoint);
  const auto up_buf = std::make_shared<std::vector<uint8_t>>(up, 1);
  const auto down_buf = std::make_shared<std::vector<uint8_t>>(down, 2);
  std::vector<double> times;
  std::barrier sync(world + 1);
  std::atomic<int64_t> last_sent{0}, last_done{0};
  std::vector<std::thread> ws;
  for (uint32_t w = 0; w < world; ++w)
    ws.emplace_back([&] {
      zmq::socket_t d(ctx, zmq::socket_type::dealer);
      d.set(zmq::sockopt::linger, 0);
      d.connect(ep);
      for (int r = 0; r < rounds; ++r) {
        sync.arrive_and_wait();
        zmq::message_t m(up_buf->data(), up_buf->size(), nullptr, nullptr);  // zero-copy, no free
        (void)d.send(m, zmq::send_flags::none);
        int64_t t = Clock::now().time_since_epoch().count();
        for (int64_t cur = last_sent; cur < t && !last_sent.compare_exchange_weak(cur, t);) {
        }
        zmq::message_t in;
        (void)d.recv(in);
        t = Clock::now().time_since_epoch().count();
        for (int64_t cur = last_done; cur < t && !last_done.compare_exchange_weak(cur, t);) {
        }
        sync.arrive_and_wait();
      }
    });
  for (int r = 0; r < rounds; ++r) {
    last_sent = 0;
    last_done = 0;
    sync.arrive_and_wait();
    std::vector<std::string> peers;
    for (uint32_t w = 0; w < world; ++w) {
      zmq::message_t id, body;
      (void)router.recv(id);
      (void)router.recv(body);
      peers.emplace_back(static_cast<const char*>(id.data()), id.size());
    }
    for (const auto& p : peers) {
      router.send(zmq::buffer(p), zmq::send_flags::sndmore);
      zmq::message_t m(down_buf->data(), down_buf->size(), nullptr, nullptr);
      router.send(m, zmq::send_flags::none);
    }
    sync.arrive_and_wait();
    times.push_back(double(last_done - last_sent) / 1e6);
  }
  for (auto& t : ws) t.join();
  return median(times);
}

Result run_case(const std::string& spec, uint64_t d, uint32_t world, int rounds,
                const Device& device) {
  ServerOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.quiet = true;
  o.status = false;
  o.job.world = world;
  o.job.dim = d;
  o.job.spec = spec;
  o.job.lr = 0.01f;
  o.job.device = device;
  o.job.max_rounds = uint64_t(rounds) + 1;
  o.finish_grace = std::chrono::milliseconds(100);
  o.metrics = "/tmp/sketchsgd_bench_ps_" + std::to_string(::getpid()) + ".jsonl";
  std::remove(o.metrics.c_str());
  Server server(o);
  server.start();
  std::thread srv([&] { server.run(); });

  const auto g = bench::xorshift_gradient(d);
  std::barrier sync(world);
  std::vector<std::vector<Clock::time_point>> pushed(world), done(world);
  std::vector<std::vector<double>> encode(world);
  std::vector<uint64_t> up(world), down(world);
  std::vector<std::thread> ws;
  const std::vector<float> init(d, 0.0f);
  for (uint32_t w = 0; w < world; ++w)
    ws.emplace_back([&, w] {
      ClientOptions c;
      c.server = server.endpoint();
      c.rank = w;
      c.world = world;
      c.log = [](const std::string&) {};
      Client client(c, make_compressor(spec, d),
                    w == 0 ? std::span<const float>(init) : std::span<const float>());
      for (int r = 0; r <= rounds; ++r) {  // round 0 warms up
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        const StepResult res = client.step(g);
        const auto t1 = Clock::now();
        if (r == 0) continue;
        pushed[w].push_back(res.pushed_at);
        done[w].push_back(t1);
        encode[w].push_back(ms(res.pushed_at - t0));
        up[w] = res.bytes_up;
        down[w] = res.bytes_down;
      }
    });
  for (auto& t : ws) t.join();
  server.stop();
  srv.join();

  std::vector<double> round_ms, enc;
  for (int r = 0; r < rounds; ++r) {
    Clock::time_point last_push{}, last_done{};
    for (uint32_t w = 0; w < world; ++w) {
      last_push = std::max(last_push, pushed[w][r]);
      last_done = std::max(last_done, done[w][r]);
      enc.push_back(encode[w][r]);
    }
    round_ms.push_back(ms(last_done - last_push));
  }
  // The server's own merge + reduce time per round, from its metrics (round 0 is the warm-up).
  std::vector<double> merge;
  {
    std::ifstream in(o.metrics);
    for (std::string l; std::getline(in, l);) {
      const auto at = l.find("\"merge_ms\":");
      if (at != std::string::npos && l.find("\"round\":0,") == std::string::npos)
        merge.push_back(std::stod(l.substr(at + 11)));
    }
  }
  std::remove(o.metrics.c_str());
  Result res{median(round_ms), 0, median(enc), median(merge), up[0], down[0]};
  // The floor moves the same bytes: W pushes of this size in, one update of this size out to each.
  res.floor_ms = loopback_floor(world, res.up_each, res.down_each, std::max(rounds, 5));
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f("sketchsgd_bench_ps: parameter-server round cost vs the loopback floor");
  f.add("codecs", "sketch,topk,dense",
        "codecs (sketch: r = 5, k = d/160, c = 10k, blocked hashing; sketch-random: the same with "
        "random buckets; topk: k = d/160)");
  f.add("dims", "1048576,4194304,16777216", "d values");
  f.add("workers", "1,2,4,8", "W values");
  f.add("rounds", "5", "measured rounds per case (median reported)");
  f.add("out", "", "append JSON lines here");
  f.add("device", "cpu", "where the server's aggregator runs: cpu or cuda[:N]");
  try {
    if (!f.parse(argc, argv)) return 0;
    const Device device = Device::parse(f.str("device"));
    std::ofstream out;
    if (!f.str("out").empty()) out.open(f.str("out"), std::ios::app);
    std::printf("%-8s %10s %3s %10s %10s %6s %10s %10s %12s %12s %8s\n", "codec", "d", "W",
                "round_ms", "floor_ms", "ratio", "merge_ms", "encode_ms", "up/worker",
                "down/worker", "vs_dense");
    std::stringstream codecs(f.str("codecs"));
    for (std::string codec; std::getline(codecs, codec, ',');)
      for (uint64_t d : list(f.str("dims")))
        for (uint64_t w : list(f.str("workers"))) {
          const std::string spec = spec_for(codec, d);
          const Result r = run_case(spec, d, uint32_t(w), int(f.u64("rounds")), device);
          const double dense = 2.0 * (double(d) * 4 + 48);  // a dense push and a dense update
          const double vs_dense = dense / double(r.up_each + r.down_each);
          std::printf("%-8s %10llu %3llu %10.2f %10.2f %6.2f %10.2f %10.2f %12llu %12llu %7.1fx\n",
                      codec.c_str(), (unsigned long long)d, (unsigned long long)w, r.round_ms,
                      r.floor_ms, r.round_ms / r.floor_ms, r.merge_ms, r.encode_ms,
                      (unsigned long long)r.up_each, (unsigned long long)r.down_each, vs_dense);
          std::fflush(stdout);
          if (out)
            out << "{\"device\":\"" << device.name() << "\",\"codec\":\"" << codec
                << "\",\"spec\":\"" << spec << "\",\"d\":" << d << ",\"workers\":" << w
                << ",\"round_ms\":" << r.round_ms << ",\"floor_ms\":" << r.floor_ms
                << ",\"merge_ms\":" << r.merge_ms << ",\"encode_ms\":" << r.encode_ms
                << ",\"up_bytes\":" << r.up_each << ",\"down_bytes\":" << r.down_each
                << ",\"wire_vs_dense\":" << vs_dense << "}\n";
        }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sketchsgd_bench_ps: %s\n", e.what());
    return 2;
  }
}
