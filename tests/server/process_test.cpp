// The server binary and worker processes on 127.0.0.1: bit-identical training against the
// in-process reference for W = 1, 2, 4; a worker killed with SIGKILL mid-round, restarted and
// rejoined; the server killed with SIGKILL and resumed from its checkpoint. Every wait is bounded.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <random>
#include <regex>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/ps/protocol.hpp>
#include <sketchsgd/server/checkpoint.hpp>
#include <zmq.hpp>
#include "support/ps_processes.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

struct Case {
  std::string spec;
  uint32_t world;
};

/// Every registered example at W = 2, each codec's first at W = 4, and one at W = 1: a new
/// codec runs over processes as soon as it registers.
std::vector<Case> cases() {
  const Layout layout = Layout::parse("50x50+500");  // Job::dim's 3,000 values
  std::vector<Case> v;
  for (const CodecEntry* e : Registry::instance().entries())
    for (const CodecExample& x : e->examples)
      v.push_back({complete_spec(x.spec, layout), 2});  // with a layout where the codec needs one
  for (const CodecEntry* e : Registry::instance().entries())
    v.push_back({complete_spec(e->examples.front().spec, layout), 4});
  v.push_back({v.front().spec, 1});
  return v;
}

class Processes : public ::testing::TestWithParam<Case> {};

TEST_P(Processes, ServerAndWorkersEqualTheInProcessReferenceBitForBit) {
  Job job{GetParam().spec, GetParam().world};
  Proc server = job.server();
  const std::string endpoint = server.line(10s);
  ASSERT_EQ(endpoint.rfind("tcp://127.0.0.1:", 0), 0u)
      << "server did not start: '" << endpoint << "'";
  std::vector<Proc> ws;
  for (uint32_t r = 0; r < job.world; ++r)
    ws.push_back(job.worker(endpoint, r, scratch("w" + std::to_string(r))));
  for (uint32_t r = 0; r < job.world; ++r) ASSERT_EQ(ws[r].wait(60s), 0) << "rank " << r;
  EXPECT_EQ(server.wait(20s), 0);
  const auto ref = job.reference();
  for (uint32_t r = 0; r < job.world; ++r) {
    const auto p = read_params(scratch("w" + std::to_string(r)), job.dim);
    ASSERT_EQ(p.size(), job.dim);
    EXPECT_EQ(std::memcmp(p.data(), ref.data(), job.dim * 4), 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Processes, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name;
                           for (const char c : info.param.spec) name += std::isalnum(c) ? c : '_';
                           return name + "_W" + std::to_string(info.param.world);
                         });

/// The server's last checkpoint is at the job's final round and every worker (parameters written
/// to scratch(prefix + rank)) holds exactly its model.
void expect_final_model_everywhere(const fs::path& ckpt, const Job& job, const std::string& prefix,
                                   uint32_t workers) {
  const auto c = load_checkpoint(ckpt.string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->round, job.rounds);
  for (uint32_t r = 0; r < workers; ++r) {
    const auto p = read_params(scratch(prefix + std::to_string(r)), job.dim);
    ASSERT_EQ(p.size(), job.dim);
    EXPECT_EQ(std::memcmp(p.data(), c->params.data(), job.dim * 4), 0) << "rank " << r;
  }
}

TEST(ProcessFaults, KilledWorkerIsOutvotedByQuorumThenRestartsAndRejoins) {
  Job job{"sketch:k=40,cols=400", 3};
  job.rounds = 12;
  job.server_extra = {"--policy",       "quorum", "--min-workers", "2",
                      "--heartbeat-ms", "100",    "--deadline-ms", "5000"};
  const auto metrics = scratch("kill-worker.jsonl");
  const auto ckpt = scratch("kill-worker.ckpt");
  fs::remove(metrics);
  fs::remove(ckpt);
  Proc server = job.server(ckpt.string(), metrics.string());
  const std::string endpoint = server.line(10s);
  ASSERT_FALSE(endpoint.empty());
  std::vector<Proc> ws;
  for (uint32_t r = 0; r < 2; ++r)
    ws.push_back(job.worker(endpoint, r, scratch("k" + std::to_string(r)), {"--sleep-ms", "20"}));
  Proc victim = job.worker(endpoint, 2, scratch("k2"), {"--die-at", "3", "--sleep-ms", "20"});
  EXPECT_EQ(victim.wait(30s), -SIGKILL);
  Proc back = job.worker(endpoint, 2, scratch("k2"), {"--sleep-ms", "20"});
  for (auto& w : ws) ASSERT_EQ(w.wait(60s), 0);
  ASSERT_EQ(back.wait(60s), 0);
  ASSERT_EQ(server.wait(20s), 0);

  expect_final_model_everywhere(ckpt, job, "k", 3);
  // Some round closed by quorum without rank 2, and every round ran exactly once.
  const auto lines = lines_of(metrics);
  ASSERT_EQ(lines.size(), job.rounds);
  bool quorum = false;
  // Every line's lists as JSON: a count of bytes per rank, the ranks left out.
  const std::regex lists(
      R"re("bytes_up":\[\d+,\d+,\d+\].*"stragglers":\[(\d+(,\d+)*)?\],"dead":\[(\d+(,\d+)*)?\],"reason":"[^"]*"\}$)re");
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_NE(lines[i].find("\"round\":" + std::to_string(i) + ","), std::string::npos) << lines[i];
    EXPECT_TRUE(std::regex_search(lines[i], lists)) << lines[i];
    // Rank 2 left out, late or dead (on a loaded machine another rank may be too: a
    // process that stalls past the heartbeats is outvoted like a dead one).
    if (lines[i].find("\"contributors\":2,") != std::string::npos)
      quorum |= lines[i].find("\"stragglers\":[2]") != std::string::npos ||
                lines[i].find("\"dead\":[2]") != std::string::npos;
  }
  EXPECT_TRUE(quorum);
}

TEST(ProcessOptimizer, AdamOnTheServerRunsOnEveryWorkerBitForBit) {
  // The server's optimizer travels in the Welcome: every worker applies Adam to its copy, and
  // ends on the server's final model.
  Job job{"topk:k=40", 2};
  job.rounds = 8;
  job.server_extra = {"--server-opt", "adam", "--opt-eps", "1e-3", "--opt-betas", "0.8,0.99"};
  const auto ckpt = scratch("adam.ckpt");
  fs::remove(ckpt);
  Proc server = job.server(ckpt.string());
  const std::string endpoint = server.line(10s);
  ASSERT_FALSE(endpoint.empty());
  std::vector<Proc> ws;
  for (uint32_t r = 0; r < 2; ++r)
    ws.push_back(job.worker(endpoint, r, scratch("adam" + std::to_string(r))));
  for (auto& w : ws) ASSERT_EQ(w.wait(60s), 0);
  ASSERT_EQ(server.wait(20s), 0);
  expect_final_model_everywhere(ckpt, job, "adam", 2);
  const auto c = load_checkpoint(ckpt.string());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->outer.size(), 2 * job.dim);
  EXPECT_EQ(c->outer_steps, job.rounds);
  // Not plain SGD: the reference (w −= lr · step) ends elsewhere.
  EXPECT_NE(c->params, job.reference());
}

TEST(ProcessFaults, KilledServerResumesFromItsCheckpointAndWorkersResync) {
  Job job{"topk:k=40", 2};
  job.rounds = 16;
  job.server_extra = {"--heartbeat-ms", "100"};
  const auto metrics = scratch("kill-server.jsonl");
  const auto ckpt = scratch("kill-server.ckpt");
  fs::remove(metrics);
  fs::remove(ckpt);
  Proc server = job.server(ckpt.string(), metrics.string());
  const std::string endpoint = server.line(10s);
  ASSERT_FALSE(endpoint.empty());
  job.bind = endpoint;  // the restarted server takes the same port
  std::vector<Proc> ws;
  for (uint32_t r = 0; r < 2; ++r)
    ws.push_back(job.worker(endpoint, r, scratch("s" + std::to_string(r)), {"--sleep-ms", "40"}));
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (lines_of(metrics).size() < 5 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(10ms);
  server.kill9();
  const auto before = lines_of(metrics).size();
  ASSERT_GE(before, 5u);
  const auto c = load_checkpoint(ckpt.string());
  ASSERT_TRUE(c);
  EXPECT_LE(c->round, before);
  Proc again = job.server(ckpt.string(), metrics.string());
  ASSERT_EQ(again.line(10s), endpoint);
  for (auto& w : ws) ASSERT_EQ(w.wait(60s), 0);
  ASSERT_EQ(again.wait(20s), 0);

  expect_final_model_everywhere(ckpt, job, "s", 2);
  // The second server's rounds start at the checkpoint's round and run once each.
  const auto lines = lines_of(metrics);
  ASSERT_EQ(lines.size(), before + (job.rounds - c->round));
  for (size_t i = before; i < lines.size(); ++i)
    EXPECT_NE(lines[i].find("\"round\":" + std::to_string(c->round + (i - before)) + ","),
              std::string::npos)
        << lines[i];
}

TEST(ProcessCli, BadFlagsExitWithAReasonNotACrash) {
  const std::vector<std::vector<std::string>> bad = {
      {"--dim", "0"},
      {"--dim", "100", "--world", "0"},
      {"--dim", "100", "--codec", "nonsense"},
      {"--dim", "100", "--policy", "sometimes"},
      {"--dim", "100", "--lr", "nan"},
      {"--dim", "100", "--outer-momentum", "1.5"},
      {"--dim", "100", "--outer-momentum", "-0.1"},
      {"--dim", "-5"},
      {"--dim", "100", "--bogus"},
      {"--dim", "100", "--bind", "tcp://256.1.1.1:1"},
      {"--dim", "100", "--curve-secret-file", "/nonexistent"},
      {"--dim", "100", "--replica-of", "nonsense"},
      {"--dim", "100", "--server-opt", "rmsprop"},
      {"--dim", "100", "--server-opt", "adam", "--opt-betas", "0.9"},
      {"--dim", "100", "--server-opt", "adam", "--opt-betas", "0.9,1"},
      {"--dim", "100", "--server-opt", "adagrad", "--outer-momentum", "0.9"},
      {"--dim", "100", "--server-opt", "adagrad", "--opt-eps", "0"},
      {"--dim", "100", "--replica-of", "tcp://127.0.0.1:1", "--population", "10"},
  };
  for (const auto& args : bad) {
    std::vector<std::string> a = {kServer, "--quiet"};
    a.insert(a.end(), args.begin(), args.end());
    Proc p = Proc::spawn(a);
    std::string joined;
    for (const auto& x : args) joined += x + " ";
    EXPECT_EQ(p.wait(10s), 2) << joined;
  }
  Proc help = Proc::spawn({kServer, "--help"});
  EXPECT_EQ(help.line(5s).rfind("sketchsgd-server:", 0), 0u);
  EXPECT_EQ(help.wait(10s), 0);
}

TEST(ProcessCli, AWorkerPastTheLastRoundExitsAtOnceWithItsOwnCode) {
  Job job{"topk:k=40", 1};
  job.rounds = 2;
  job.server_extra = {"--finish-grace-ms", "30000"};  // lingers, answering late workers
  Proc server = job.server();
  const std::string endpoint = server.line(10s);
  ASSERT_FALSE(endpoint.empty());
  ASSERT_EQ(job.worker(endpoint, 0, scratch("late0")).wait(30s), 0);
  // Another process wants rounds the job never runs: told so, not left waiting 20 s.
  Job longer = job;
  longer.rounds = 5;
  auto args = longer.job_flags(kWorker);
  args.insert(args.end(), {"--server", endpoint, "--rank", "0", "--timeout-ms", "20000"});
  const auto t0 = std::chrono::steady_clock::now();
  Proc late = Proc::spawn(args);
  EXPECT_EQ(late.wait(15s), kExitJobFinished);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  ::kill(server.pid(), SIGTERM);
  EXPECT_EQ(server.wait(10s), 0);
}

TEST(ProcessFaults, FinishedServerExitsWithinLingerAndGraceWhateverPeersDo) {
  Job job{"sketch:k=40,cols=400", 1};
  job.rounds = 4;
  job.server_extra = {"--linger-ms", "500", "--finish-grace-ms", "300"};
  Proc server = job.server();
  const std::string endpoint = server.line(10s);
  ASSERT_FALSE(endpoint.empty());
  // 16 peers flood the server with mutated copies of real traffic and never read its answers, so
  // its send queues to them fill; half of them vanish at the job's end, half stay and go on.
  std::atomic<int> phase{0};  // 0: flood, 1: the job ended, half leave, 2: stop
  std::atomic<long> sent{0};
  std::thread abuse([&] {
    zmq::context_t ctx;
    std::vector<zmq::socket_t> peers;
    for (int i = 0; i < 16; ++i) {
      peers.emplace_back(ctx, zmq::socket_type::dealer);
      peers.back().set(zmq::sockopt::linger, 0);
      peers.back().set(zmq::sockopt::sndhwm, 2000);
      peers.back().set(zmq::sockopt::rcvhwm, 1);
      peers.back().connect(endpoint);
    }
    const auto codec = make_compressor(job.spec, job.dim);
    const Bytes push = codec->encode(test::initial_params(job.dim, 1), 0, 0).release();
    const Bytes hello = encode(HelloInfo{2, job.dim, codec->spec()});  // wrong world: refused
    std::mt19937 rng(11);
    const auto end = std::chrono::steady_clock::now() + 60s;
    for (long n = 0; phase < 2 && std::chrono::steady_clock::now() < end && n < 2000000; ++n) {
      if (phase == 1 && peers.size() == 16) peers.resize(8);  // closed without a goodbye
      const size_t i = size_t(n) % peers.size();
      const bool is_hello = n % 3 == 0;
      Bytes env = encode(
          Envelope{is_hello ? Type::Hello : Type::Push, 3, uint64_t(n % 5), 0, 0, uint64_t(rng())});
      Bytes body = is_hello ? hello : push;
      if (n % 2) body[rng() % body.size()] ^= uint8_t(1 + rng() % 255);  // a mutated replay
      zmq::message_t a(env.data(), env.size()), b(body.data(), body.size());
      if (peers[i].send(a, zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        (void)peers[i].send(b, zmq::send_flags::dontwait);
      ++sent;
      if (n % 64 == 0) std::this_thread::sleep_for(1ms);
    }
  });
  Proc w = job.worker(endpoint, 0, scratch("abused0"));
  EXPECT_EQ(w.wait(60s), 0);
  phase = 1;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = server.wait(20s);
  const auto took = std::chrono::steady_clock::now() - t0;
  phase = 2;
  abuse.join();
  EXPECT_EQ(rc, 0) << "the server did not exit after its job ended";
  // linger 0.5 s + grace 0.3 s, with room for a loaded 2-core machine; never minutes.
  EXPECT_LT(took, 6s) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms to exit";
  EXPECT_GT(sent.load(), 1000);
}

long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string l; std::getline(in, l);)
    if (l.rfind("VmRSS:", 0) == 0) return std::stol(l.substr(6));
  return -1;
}

TEST(ProcessFaults, GarbageFloodLeavesServerMemoryBoundedAndServing) {
  Job job{"sketch:k=40,cols=400", 1};
  job.rounds = 3;
  Proc server = job.server();
  const std::string endpoint = server.line(10s);
  ASSERT_FALSE(endpoint.empty());
  std::this_thread::sleep_for(200ms);
  const long before = rss_kib(server.pid());
  ASSERT_GT(before, 0);
  {
    zmq::context_t ctx;
    std::mt19937 rng(5);
    const Bytes env = encode(Envelope{Type::Push, 3, 0, 0, 0});
    // 10 connections × 2,000 messages of up to 7 frames, garbage of every shape, never read back.
    for (int c = 0; c < 10; ++c) {
      zmq::socket_t s(ctx, zmq::socket_type::dealer);
      s.set(zmq::sockopt::linger, 200);
      s.set(zmq::sockopt::sndhwm, 100000);
      s.connect(endpoint);
      for (int i = 0; i < 2000; ++i) {
        const int parts = 1 + int(rng() % 7);
        for (int k = 0; k < parts; ++k) {
          // Frames stay under the server's size limit: one above it drops the connection, and
          // libzmq 4.3.4 then aborts in the *sender* when that happens mid multipart message
          // (its session_base.cpp:260 assertion), which would end this test process.
          zmq::message_t m(k == 0 && i % 2 ? env.size() : size_t(rng() % 12000));
          if (k == 0 && i % 2) std::memcpy(m.data(), env.data(), env.size());
          (void)s.send(m, k + 1 < parts ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      }
    }
    // Oversized frames, each a whole message on a connection of its own: the server drops those
    // connections (ZMQ_MAXMSGSIZE) without reading the frames.
    for (int c = 0; c < 5; ++c) {
      zmq::socket_t s(ctx, zmq::socket_type::dealer);
      s.set(zmq::sockopt::linger, 200);
      s.connect(endpoint);
      zmq::message_t big(size_t(200000 + c));
      (void)s.send(big, zmq::send_flags::none);
    }
  }
  std::this_thread::sleep_for(500ms);
  const long after = rss_kib(server.pid());
  EXPECT_LT(after - before, 64 * 1024)
      << "server grew from " << before << " to " << after << " KiB";
  // And it still trains a real worker.
  Proc w = job.worker(endpoint, 0, scratch("flood0"));
  EXPECT_EQ(w.wait(30s), 0);
  EXPECT_EQ(server.wait(20s), 0);
}

}  // namespace
}  // namespace sketchsgd::ps
