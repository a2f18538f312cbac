// A seeded search over single forged messages, in process with a fake clock: a job's own
// messages (Hello, Init, Pull, Push, Answer, Heartbeat, Bye) and the replication's (Follow, Ack,
// Sync, Commit, Deposed), mutated (a byte flipped, a field overwritten with an extreme value, cut,
// grown, a frame dropped or doubled, another type) and sent from strangers' connections between
// the job's own messages, once its ranks are registered. Whatever a seed sends, the job ends bit
// for bit as without the strangers and no server is deposed: a peer that merely reaches the port
// can refuse itself, not end or corrupt a job. A failing seed is printed with the messages it
// forged.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/protocol.hpp>
#include "support/helpers.hpp"
#include "support/ps_job.hpp"
#include "support/ps_net.hpp"
#include "support/ps_synthetic.hpp"

namespace sketchsgd::ps {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kWorld = 2;
constexpr uint64_t kDim = 300, kRounds = 3;

/// The job's kinds of message, well formed, as the worker w (or a backup) would send them.
std::vector<Frames> corpus(const JobConfig& cfg, FakeWorker& w, const std::vector<float>& init) {
  const HelloInfo h{cfg.world, cfg.dim, w.codec->spec(), 0, ShardId{0, 1, 0, cfg.dim}, 0};
  const Message push = w.codec->encode(test::synthetic_grad(init, w.rank, 0, 3), 0, w.rank);
  const auto raw = [](std::span<const float> v) {
    return bytes_frame({reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes()});
  };
  ReplicaInfo ri{0, 12345};
  CommitInfo ci;
  return {{env(Type::Hello, cfg.job, 0, w.rank), Frame::own(encode(h))},
          {w.mine(Type::Init, 0), raw(init)},
          {w.mine(Type::Pull, 0)},
          {w.mine(Type::Push, 0), bytes_frame(push)},
          {w.mine(Type::Answer, 0), bytes_frame(push)},
          {w.mine(Type::Heartbeat, 0)},
          {w.mine(Type::Bye, 0)},
          {env(Type::Follow, cfg.job, 0, 0), Frame::own(encode(h))},
          {env(Type::Ack, cfg.job, 1, 0)},
          {env(Type::Sync, cfg.job, 0, 0), Frame::own(encode(ri)), raw(init)},
          {env(Type::Commit, cfg.job, 0, 0), Frame::own(encode(ci)), bytes_frame(push)},
          {env(Type::Deposed, cfg.job, 0, 0), Frame::own(encode(DeposedInfo{99, "forged"}))}};
}

/// One mutation of one message of the corpus; `trace` says what it did.
Frames forge(const std::vector<Frames>& corpus, std::mt19937_64& rng, std::string& trace) {
  const size_t pick = rng() % corpus.size();
  Frames f = corpus[pick];
  std::vector<Bytes> b;
  for (const auto& x : f) b.emplace_back(x.bytes().begin(), x.bytes().end());
  const size_t fi = rng() % b.size();
  Bytes& v = b[fi];
  std::ostringstream t;
  t << "message " << pick << " frame " << fi << ": ";
  static const uint64_t extremes[] = {
      0,           1, 2, uint64_t(1) << 31, uint64_t(1) << 32, uint64_t(1) << 56, ~uint64_t(0) >> 1,
      ~uint64_t(0)};
  switch (rng() % 7) {
    case 0:
      if (!v.empty()) {
        const size_t at = rng() % v.size();
        v[at] ^= uint8_t(1 + rng() % 255);
        t << "byte " << at << " flipped";
      }
      break;
    case 1:
      if (v.size() >= 8) {
        const size_t at = rng() % (v.size() - 7);
        const uint64_t x = extremes[rng() % std::size(extremes)];
        std::memcpy(v.data() + at, &x, 8);
        t << "u64 at " << at << " = " << x;
      }
      break;
    case 2:
      t << "cut to " << (v.resize(v.empty() ? 0 : rng() % v.size()), v.size());
      break;
    case 3:
      v.resize(v.size() + 1 + rng() % 16, uint8_t(rng()));
      t << "grown to " << v.size();
      break;
    case 4:
      if (b.size() > 1) {
        b.erase(b.begin() + long(fi));
        t << "dropped";
      }
      break;
    case 5:
      b.insert(b.begin() + long(fi), b[fi]);
      t << "doubled";
      break;
    case 6:
      if (b[0].size() > 6) {
        b[0][6] = uint8_t(rng() % 24);  // the envelope's type
        t << "type " << int(b[0][6]);
      }
      break;
  }
  trace += t.str() + "; ";
  Frames out;
  for (const auto& x : b) out.push_back(bytes_frame(x));
  return out;
}

/// The job's rounds; each message of its own is preceded by `forged` strangers' ones (none: the
/// reference). Heartbeats keep the workers alive while a round waits (a stranger that became the
/// backup holds it until the deadline). Returns the model.
std::vector<float> run(const std::string& spec, uint64_t seed, int forged, std::string& trace,
                       bool& deposed) {
  const JobConfig cfg = test_job::make(spec, kWorld, kDim);
  Net net(cfg);
  std::mt19937_64 rng(seed);
  const auto init = test::initial_params(kDim, 5);
  std::vector<FakeWorker> ws;
  for (uint32_t r = 0; r < kWorld; ++r) ws.emplace_back(r, cfg);
  std::vector<Frames> msgs;
  uint64_t stranger = 0;
  const auto strangers = [&] {
    for (int i = 0; i < forged; ++i)
      net.deliver("stranger-" + std::to_string(stranger++ % 5), forge(msgs, rng, trace));
  };
  // The strangers come once every rank is held (before, without CURVE, the first Hello of a
  // rank takes it: the one thing keys are for). They copy rank 0's messages, its session token
  // included, as one that sees the traffic could.
  for (auto& w : ws) w.join(net, init);
  msgs = corpus(cfg, ws[0], init);
  for (auto& w : ws) {
    for (int tries = 0; tries < 200 && !w.take_model(net); ++tries) {
      strangers();
      net.deliver(w.peer, {w.mine(Type::Pull, 0)});
    }
    if (w.params.empty()) ADD_FAILURE() << "rank " << w.rank << " never got the model";
  }
  for (uint64_t t = 0; t < kRounds; ++t) {
    for (auto& w : ws) {
      strangers();
      w.push(net, test::synthetic_grad(w.params, w.rank, t, 11));
    }
    std::vector<bool> ended(kWorld, false);
    for (int pass = 0; pass < 400 && std::count(ended.begin(), ended.end(), true) < kWorld;
         ++pass) {
      for (uint32_t r = 0; r < kWorld; ++r)
        if (!ended[r]) ended[r] = ws[r].settle(net) == Type::Update;
      strangers();
      for (auto& w : ws) net.deliver(w.peer, {w.mine(Type::Heartbeat, 0)});
      net.tick(cfg.heartbeat / 2);
    }
    if (std::count(ended.begin(), ended.end(), true) < kWorld) {
      ADD_FAILURE() << "round " << t << " never ended";
      break;
    }
  }
  deposed = net.primary.deposed().has_value();
  for (auto& w : ws)
    if (w.params != std::vector<float>(net.engine.model().begin(), net.engine.model().end()))
      ADD_FAILURE() << "rank " << w.rank << " left the server's model";
  return {net.engine.model().begin(), net.engine.model().end()};
}

class Forgery : public ::testing::TestWithParam<std::string> {};

TEST_P(Forgery, NoStrangersMessageEndsOrCorruptsAJob) {
  std::string none;
  bool deposed = false;
  const auto ref = run(GetParam(), 0, 0, none, deposed);
  ASSERT_EQ(ref.size(), kDim);
  ASSERT_NE(ref, test::initial_params(kDim, 5)) << "nothing was trained";
  for (uint64_t seed = 1; seed <= 1000; ++seed) {
    std::string trace;
    const auto got = run(GetParam(), seed, 1 + int(seed % 3), trace, deposed);
    ASSERT_FALSE(deposed) << "seed " << seed << ": " << trace;
    ASSERT_EQ(got, ref) << "seed " << seed << ": " << trace;
    if (HasFailure()) FAIL() << "seed " << seed << ": " << trace;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Forgery,
                         ::testing::Values("dense", "topk:k=30", "sketch:k=20,cols=200,fetch=1",
                                           "sketch:k=20,cols=200,p2=2",
                                           "powersgd:rank=2,layout=15x20"),
                         [](const auto& info) {
                           std::string s;
                           for (char c : info.param) s += std::isalnum(c) ? c : '_';
                           return s;
                         });

}  // namespace
}  // namespace sketchsgd::ps
