// sketchsgd_test_worker: a worker process on the synthetic problem of ps_synthetic.hpp, for the
// multi-process tests and the round benchmarks. Writes its final parameters (raw fp32) to --out.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/worker/client.hpp>
#include "support/ps_synthetic.hpp"

int main(int argc, char** argv) {
  using namespace sketchsgd::ps;
  Flags f("sketchsgd_test_worker: synthetic worker for parameter-server tests");
  f.add("server", "tcp://127.0.0.1:5555", "server endpoint");
  f.add("job", "1", "job id");
  f.add("rank", "0", "rank");
  f.add("world", "1", "world size");
  f.add("dim", "1000", "parameters");
  f.add("codec", "sketch", "codec spec");
  f.add("rounds", "10", "train until the model is at this round");
  f.add("seed", "1", "problem seed");
  f.add("out", "", "write final parameters here");
  f.add("die-at", "0",
        "SIGKILL itself right after pushing this round or the first after it (0: never)");
  f.add("sleep-ms", "0", "pause before each round (a slow worker)");
  f.add("timeout-ms", "20000", "longest wait for the server");
  try {
    if (!f.parse(argc, argv)) return 0;
    ClientOptions o;
    o.server = f.str("server");
    o.job = f.u64("job");
    o.rank = uint32_t(f.u64("rank"));
    o.world = uint32_t(f.u64("world"));
    o.timeout = std::chrono::milliseconds(f.u64("timeout-ms"));
    const uint64_t dim = f.u64("dim"), rounds = f.u64("rounds"), seed = f.u64("seed");
    const uint64_t die_at = f.u64("die-at");
    const auto init = sketchsgd::test::initial_params(dim, seed);
    Client c(o, sketchsgd::make_compressor(f.str("codec"), dim), init);
    uint64_t steps = 0;
    // With bounded staleness a step returns before its round ends: push no round past the
    // job's last (the server would answer that the job has finished), then settle the rest.
    while (c.next_push() < rounds && steps++ < 4 * rounds + 100) {
      if (const auto ms = f.u64("sleep-ms")) usleep(useconds_t(ms * 1000));
      const auto g = sketchsgd::test::synthetic_grad(c.params(), o.rank, c.round(), seed);
      if (die_at && c.round() >= die_at) {
        // Push, then die mid-round without a goodbye (at a later round where a quorum closed
        // the named one without this worker, as a loaded machine makes it late).
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          std::raise(SIGKILL);
        }).detach();
      }
      c.step(g);
    }
    if (c.round() < rounds) c.sync();
    if (!f.str("out").empty()) {
      std::ofstream out(f.str("out"), std::ios::binary);
      out.write(reinterpret_cast<const char*>(c.params().data()), std::streamsize(dim * 4));
    }
    std::printf("rank %u done at round %llu\n", o.rank, (unsigned long long)c.round());
    return 0;
  } catch (const sketchsgd::JobFinished& e) {
    std::fprintf(stderr, "sketchsgd_test_worker: nothing to do: %s\n", e.what());
    return kExitJobFinished;
  } catch (const sketchsgd::Error& e) {
    std::fprintf(stderr, "sketchsgd_test_worker: %s\n", e.what());
    return 2;
  }
}
