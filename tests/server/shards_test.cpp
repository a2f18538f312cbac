// Sharded servers on the fake network: S Engines, each holding one range, and workers pushing
// every shard its part. Parts may arrive in any order, twice, or after their round: the shards'
// models are the one server's model cut in ranges. Registration and checkpoints name the shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include <sketchsgd/ps/shards.hpp>
#include "support/ps_job.hpp"
#include "support/ps_net.hpp"
#include "support/ps_synthetic.hpp"

namespace sketchsgd::ps {
namespace {

JobConfig shard_job(const std::string& spec, uint32_t world, uint64_t dim, uint32_t count,
                    uint32_t index) {
  const ShardPlan p = plan_shards(spec, dim, count)[index];
  JobConfig c = test_job::make(p.spec, world, p.dim);
  c.shard = p.id;
  return c;
}

std::string refusal(Net& net, const PeerId& peer) {
  auto m = net.next(peer);
  if (!m || m->first.type != Type::Refuse) return "(no refusal)";
  return decode_refuse(m->second[1].bytes()).reason;
}

TEST(ShardedEngine, PartsInAnyOrderTwiceOrLateGiveTheOneServerModelInRanges) {
  constexpr uint64_t kDim = 301, kRounds = 4;
  constexpr uint32_t kWorld = 3, kShards = 3;
  const std::string spec = "dense";
  const auto init = test::initial_params(kDim, 7);

  Net one(test_job::make(spec, kWorld, kDim));
  std::vector<FakeWorker> ref;
  for (uint32_t r = 0; r < kWorld; ++r) ref.emplace_back(r, one.engine.config());
  for (auto& w : ref) w.join(one, init);
  for (auto& w : ref) ASSERT_TRUE(w.take_model(one));

  std::vector<std::unique_ptr<Net>> nets;
  std::vector<std::vector<FakeWorker>> ws(kShards);  // [shard][rank]
  const auto plan = plan_shards(spec, kDim, kShards);
  for (uint32_t s = 0; s < kShards; ++s) {
    nets.push_back(std::make_unique<Net>(shard_job(spec, kWorld, kDim, kShards, s)));
    const auto part = std::span<const float>(init).subspan(plan[s].id.begin, plan[s].dim);
    for (uint32_t r = 0; r < kWorld; ++r) ws[s].emplace_back(r, nets[s]->engine.config());
    for (auto& w : ws[s]) w.join(*nets[s], part);
    for (auto& w : ws[s]) ASSERT_TRUE(w.take_model(*nets[s]));
  }
  auto assembled = [&](uint32_t r) {
    std::vector<float> p;
    for (uint32_t s = 0; s < kShards; ++s)
      p.insert(p.end(), ws[s][r].params.begin(), ws[s][r].params.end());
    return p;
  };

  std::mt19937 order(11);
  for (uint64_t t = 0; t < kRounds; ++t) {
    for (auto& w : ref) w.push(one, test::synthetic_grad(w.params, w.rank, t, 3));
    for (auto& w : ref) ASSERT_EQ(w.settle(one), Type::Update);

    std::vector<std::vector<float>> grads;
    for (uint32_t r = 0; r < kWorld; ++r)
      grads.push_back(test::synthetic_grad(assembled(r), r, t, 3));
    std::vector<std::pair<uint32_t, uint32_t>> parts;  // (shard, rank), shuffled
    for (uint32_t s = 0; s < kShards; ++s)
      for (uint32_t r = 0; r < kWorld; ++r) parts.emplace_back(s, r);
    std::shuffle(parts.begin(), parts.end(), order);
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto [s, r] = parts[i];
      FakeWorker& w = ws[s][r];
      const auto part = std::span<const float>(grads[r]).subspan(plan[s].id.begin, plan[s].dim);
      const Message m = w.codec->encode(part, w.round, w.rank);
      nets[s]->deliver(w.peer, {w.mine(Type::Push, w.round), bytes_frame(m)});
      if (i == 1)  // a duplicate: dropped
        nets[s]->deliver(w.peer, {w.mine(Type::Push, w.round), bytes_frame(m)});
    }
    for (uint32_t s = 0; s < kShards; ++s)
      for (auto& w : ws[s]) ASSERT_EQ(w.settle(*nets[s]), Type::Update) << "shard " << s;
    // A part of the round just closed, late: refused, the model stays.
    const std::vector<float> before(nets[1]->engine.model().begin(), nets[1]->engine.model().end());
    FakeWorker& late = ws[1][2];
    const Message m = late.codec->encode(std::vector<float>(plan[1].dim, 1.0f), t, late.rank);
    nets[1]->deliver(late.peer, {late.mine(Type::Push, t), bytes_frame(m)});
    EXPECT_TRUE(std::equal(before.begin(), before.end(), nets[1]->engine.model().begin()));
    while (nets[1]->next(late.peer)) {
    }
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    const auto p = assembled(r);
    ASSERT_EQ(p.size(), kDim);
    EXPECT_EQ(std::memcmp(p.data(), ref[r].params.data(), kDim * 4), 0) << "rank " << r;
  }
  for (uint32_t s = 0; s < kShards; ++s) {
    EXPECT_EQ(nets[s]->engine.round(), kRounds);
    EXPECT_EQ(std::memcmp(nets[s]->engine.model().data(),
                          one.engine.model().data() + plan[s].id.begin, plan[s].dim * 4),
              0)
        << "shard " << s;
  }
}

TEST(ShardedEngine, RegistrationAndCheckpointsNameTheShard) {
  constexpr uint64_t kDim = 300;
  Net shard1(shard_job("topk:k=30", 2, kDim, 3, 1));
  const JobConfig& cfg = shard1.engine.config();

  FakeWorker other(0, shard_job("topk:k=30", 2, kDim, 3, 2));  // shard 2's worker, same length
  other.hello(shard1);
  EXPECT_NE(refusal(shard1, other.peer)
                .find("shard 2 of 3: [200, 300) of 300, this server is "
                      "shard 1 of 3: [100, 200) of 300"),
            std::string::npos);
  FakeWorker whole(0, test_job::make(cfg.spec, 2, cfg.dim));  // one server's worker, same length
  whole.hello(shard1);
  EXPECT_NE(refusal(shard1, whole.peer).find("shard 0 of 1"), std::string::npos);
  FakeWorker fewer(0, shard_job("topk:k=30", 2, kDim, 2, 1));  // planned for 2 shards
  fewer.hello(shard1);
  EXPECT_NE(refusal(shard1, fewer.peer).find("shard 1 of 2"), std::string::npos);
  FakeWorker right(0, cfg);
  right.hello(shard1);
  EXPECT_EQ(shard1.next(right.peer)->first.type, Type::Welcome);

  // A checkpoint of shard 1 does not restore shard 2 (same length and spec) or a whole model.
  shard1.engine.restore(
      Checkpoint{cfg.job, 3, cfg.spec, std::vector<float>(100, 0.5f), {}, {}, cfg.shard});
  EXPECT_EQ(shard1.engine.round(), 3u);
  const Checkpoint c = shard1.engine.checkpoint();
  EXPECT_EQ(c.shard, cfg.shard);
  Net shard2(shard_job("topk:k=30", 2, kDim, 3, 2));
  EXPECT_THROW(shard2.engine.restore(c), ConfigMismatch);
  Checkpoint unnamed = c;  // an older checkpoint: a whole model of 100
  unnamed.shard = {};
  EXPECT_THROW(shard1.engine.restore(unnamed), ConfigMismatch);
  Net whole_job(test_job::make(cfg.spec, 2, 100));
  EXPECT_THROW(whole_job.engine.restore(c), ConfigMismatch);
  EXPECT_NO_THROW(whole_job.engine.restore(unnamed));

  // The file keeps the shard (format 3).
  const std::string path = ::testing::TempDir() + "shard1.ckpt";
  save_checkpoint(path, c);
  const auto back = load_checkpoint(path);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->shard, cfg.shard);
  EXPECT_EQ(back->params, c.params);
  std::remove(path.c_str());
}

TEST(ShardedEngine, AShardRangeOutsideTheModelIsRefused) {
  JobConfig c = test_job::make("dense", 2, 100);
  c.shard = {3, 3, 0, 300};
  EXPECT_THROW(Engine{c}, InvalidArgument);  // index ≥ count
  c.shard = {1, 3, 250, 300};
  EXPECT_THROW(Engine{c}, InvalidArgument);  // [250, 350) leaves the model
  c.shard = {0, 1, 10, 110};
  EXPECT_THROW(Engine{c}, InvalidArgument);  // one server holds the whole model
}

}  // namespace
}  // namespace sketchsgd::ps
