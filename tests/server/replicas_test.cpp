// Replicated servers as processes on 127.0.0.1: a primary killed with SIGKILL mid-job is replaced
// by its backup and the job ends bit for bit as without the failure (several codec families); a
// backup lost first; both lost (a timeout, not a hang); a primary paused while its backup took
// over stops when it wakes (split brain). Every wait is bounded.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <sketchsgd/ps/flags.hpp>
#include <zmq.hpp>
#include "support/ps_processes.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

/// A primary, its backup and the workers of `job` (W = job.world), all with fast heartbeats so a
/// failover takes a few hundred milliseconds.
struct Replicated {
  Replicated(Job j, const std::string& name, uint64_t rounds = 12) : job(std::move(j)), name(name) {
    job.rounds = rounds;
    job.server_extra.insert(job.server_extra.end(), {"--heartbeat-ms", "100", "--deadline-ms",
                                                     "20000", "--policy", "wait"});
    for (const char* f : {"-p.jsonl", "-b.jsonl"}) fs::remove(scratch(name + f));
    primary = job.server("", scratch(name + "-p.jsonl").string());
    primary_at = primary.line(10s);
    Job b = job;
    b.server_extra.insert(b.server_extra.end(), {"--replica-of", primary_at});
    backup = b.server("", scratch(name + "-b.jsonl").string());
    backup_at = backup.line(10s);
    endpoints = primary_at + "|" + backup_at;
  }
  void start_workers() {
    for (uint32_t r = 0; r < job.world; ++r)
      workers.push_back(job.worker(endpoints, r, out(r), {"--sleep-ms", "30"}));
  }
  fs::path out(uint32_t r) const { return scratch(name + "-w" + std::to_string(r)); }
  /// Waits until the server writing `metrics` has ended `rounds` rounds.
  void wait_rounds(const std::string& suffix, size_t rounds) const {
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (lines_of(scratch(name + suffix)).size() < rounds &&
           std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(10ms);
    ASSERT_GE(lines_of(scratch(name + suffix)).size(), rounds);
  }
  void expect_reference_everywhere() const {
    const auto ref = job.reference();
    for (uint32_t r = 0; r < job.world; ++r) {
      const auto p = read_params(out(r), job.dim);
      ASSERT_EQ(p.size(), job.dim) << "rank " << r;
      EXPECT_EQ(std::memcmp(p.data(), ref.data(), job.dim * 4), 0) << "rank " << r;
    }
  }
  /// The rounds a server's metrics name, in order.
  std::vector<uint64_t> rounds_of(const std::string& suffix) const {
    std::vector<uint64_t> v;
    for (const auto& l : lines_of(scratch(name + suffix)))
      v.push_back(std::stoull(l.substr(l.find("\"round\":") + 8)));
    return v;
  }

  Job job;
  std::string name;
  Proc primary, backup;
  std::string primary_at, backup_at, endpoints;
  std::vector<Proc> workers;
};

class ProcessReplicas : public ::testing::TestWithParam<const char*> {};

TEST_P(ProcessReplicas, AKilledPrimarysBackupTakesOverAndTheJobEndsBitForBit) {
  Replicated j(Job{GetParam(), 2}, "failover");
  j.start_workers();
  j.wait_rounds("-p.jsonl", 4);
  j.primary.kill9();
  for (auto& w : j.workers) ASSERT_EQ(w.wait(60s), 0);
  EXPECT_EQ(j.backup.wait(20s), 0);
  j.expect_reference_everywhere();
  // The backup ran the rounds from where the primary's last acknowledged one ended, each once.
  const auto p = j.rounds_of("-p.jsonl"), b = j.rounds_of("-b.jsonl");
  ASSERT_FALSE(b.empty());
  EXPECT_LE(b.front(), p.back() + 1);
  EXPECT_GE(b.front() + 1, p.back());  // at most the one unacknowledged round again
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], b.front() + i);
  EXPECT_EQ(b.back(), j.job.rounds - 1);
}

INSTANTIATE_TEST_SUITE_P(Codecs, ProcessReplicas,
                         // Every codec fails over in process (replication_test); as processes: one
                         // of each kind of round (one phase, two phases, server state).
                         ::testing::Values("dense", "sketch:k=40,cols=400,p2=2",
                                           "sketch:k=40,cols=400,fetch=1"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(ProcessReplicasFaults, ABackupLostFirstLeavesThePrimaryServingAlone) {
  Replicated j(Job{"topk:k=40", 2}, "lost-backup");
  j.start_workers();
  j.wait_rounds("-p.jsonl", 3);
  j.backup.kill9();
  for (auto& w : j.workers) ASSERT_EQ(w.wait(60s), 0);
  EXPECT_EQ(j.primary.wait(20s), 0);
  j.expect_reference_everywhere();
  EXPECT_EQ(j.rounds_of("-p.jsonl").size(), j.job.rounds);
}

TEST(ProcessReplicasFaults, ABoundedStaleJobFailsOverToo) {
  // Workers run up to 2 rounds ahead; what they computed depends on timing, so no reference:
  // they must end on the same model, the backup's.
  Job job{"topk:k=40", 2};
  job.server_extra = {"--staleness", "2"};
  Replicated j(job, "stale");
  j.start_workers();
  j.wait_rounds("-p.jsonl", 4);
  j.primary.kill9();
  for (auto& w : j.workers) ASSERT_EQ(w.wait(60s), 0);
  EXPECT_EQ(j.backup.wait(20s), 0);
  const auto w0 = read_params(j.out(0), j.job.dim), w1 = read_params(j.out(1), j.job.dim);
  ASSERT_EQ(w0.size(), j.job.dim);
  EXPECT_EQ(w0, w1);
  EXPECT_EQ(j.rounds_of("-b.jsonl").back(), j.job.rounds - 1);
}

TEST(ProcessReplicasFaults, BothLostIsATimeoutNotAHang) {
  Replicated j(Job{"topk:k=40", 2}, "both-lost");
  for (uint32_t r = 0; r < 2; ++r)
    j.workers.push_back(
        j.job.worker(j.endpoints, r, j.out(r), {"--sleep-ms", "30", "--timeout-ms", "3000"}));
  j.wait_rounds("-p.jsonl", 3);
  j.backup.kill9();
  j.primary.kill9();
  for (auto& w : j.workers) EXPECT_EQ(w.wait(30s), 2) << "a clear error, exit status 2";
}

TEST(ProcessReplicasFaults, APrimaryPausedWhileItsBackupTookOverStopsWhenItWakes) {
  Replicated j(Job{"sketch:k=40,cols=400,fetch=1", 2}, "split-brain", 60);
  j.start_workers();
  j.wait_rounds("-p.jsonl", 4);
  ::kill(j.primary.pid(), SIGSTOP);  // alive, its sockets open: it only stops answering
  j.wait_rounds("-b.jsonl", 2);      // the workers moved to the backup, which took over
  ::kill(j.primary.pid(), SIGCONT);  // while the job goes on there
  EXPECT_EQ(j.primary.wait(20s), kExitDeposed);
  for (auto& w : j.workers) ASSERT_EQ(w.wait(60s), 0);
  EXPECT_EQ(j.backup.wait(20s), 0);
  j.expect_reference_everywhere();
}

TEST(ProcessReplicasFaults, OneShardsPrimaryLostInAShardedJob) {
  // Two shards, each with a backup; the workers list "P0|B0,P1|B1". Dense shards end on one
  // server's bits, so the reference holds.
  std::vector<std::unique_ptr<Replicated>> shards;
  std::string endpoints;
  for (uint32_t i = 0; i < 2; ++i) {
    Job job{"dense", 2};
    job.server_extra = {"--shards", "2", "--shard", std::to_string(i)};
    shards.push_back(std::make_unique<Replicated>(job, "sharded" + std::to_string(i)));
    endpoints += (i ? "," : "") + shards.back()->endpoints;
  }
  Replicated& one = *shards[1];
  std::vector<Proc> ws;
  for (uint32_t r = 0; r < 2; ++r)
    ws.push_back(one.job.worker(endpoints, r, one.out(r), {"--sleep-ms", "30"}));
  one.wait_rounds("-p.jsonl", 4);
  one.primary.kill9();
  for (auto& w : ws) ASSERT_EQ(w.wait(60s), 0);
  EXPECT_EQ(one.backup.wait(20s), 0);
  EXPECT_EQ(shards[0]->primary.wait(20s), 0);
  EXPECT_EQ(shards[0]->backup.wait(20s), 0);  // its primary said the job is over
  one.expect_reference_everywhere();
  EXPECT_EQ(one.rounds_of("-b.jsonl").back(), one.job.rounds - 1);
  EXPECT_TRUE(shards[0]->rounds_of("-b.jsonl").empty()) << "shard 0's backup took over";
}

/// A port nobody listens on now (for a server the workers must know before it starts).
std::string free_endpoint() {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  s.bind("tcp://127.0.0.1:*");
  return s.get(zmq::sockopt::last_endpoint);
}

TEST(ProcessReplicasFaults, ANewBackupCatchesUpFromTheLiveServerAndTakesOverInTurn) {
  Replicated j(Job{"sketch:k=40,cols=400,fetch=1", 2}, "chain", 50);
  const std::string third = free_endpoint();
  j.endpoints += "|" + third;  // the workers try each in turn
  j.start_workers();
  j.wait_rounds("-p.jsonl", 4);
  j.primary.kill9();
  j.wait_rounds("-b.jsonl", 2);  // the backup took over; a new one follows it from its round
  Job c = j.job;
  c.bind = third;
  c.server_extra.insert(c.server_extra.end(), {"--replica-of", j.backup_at});
  fs::remove(scratch("chain-c.jsonl"));
  Proc next = c.server("", scratch("chain-c.jsonl").string());
  ASSERT_EQ(next.line(10s), third);
  const size_t at = j.rounds_of("-b.jsonl").size();
  j.wait_rounds("-b.jsonl", at + 3);  // it holds the state by now
  j.backup.kill9();
  for (auto& w : j.workers) ASSERT_EQ(w.wait(60s), 0);
  EXPECT_EQ(next.wait(20s), 0);
  j.expect_reference_everywhere();
  const auto rounds = lines_of(scratch("chain-c.jsonl"));
  ASSERT_FALSE(rounds.empty()) << "the third server never ran a round";
  EXPECT_NE(rounds.back().find("\"round\":" + std::to_string(j.job.rounds - 1) + ","),
            std::string::npos);
}

}  // namespace
}  // namespace sketchsgd::ps
