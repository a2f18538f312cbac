// The shard plan (ranges, budgets, layouts) and the endpoint list of a sharded job.
#include <gtest/gtest.h>

#include <numeric>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/ps/shards.hpp>

namespace sketchsgd::ps {
namespace {

uint64_t option(const std::string& spec, const std::string& key) {
  const auto [e, o] = Registry::instance().parse(spec);
  return o.integer(key);
}

TEST(ShardPlan, EvenRangesCoverTheModelAndShareTheBudgetExactly) {
  for (const uint32_t s : {1u, 2u, 3u, 7u}) {
    const auto plan = plan_shards("sketch:rows=3,cols=1001,k=97", 10007, s);
    ASSERT_EQ(plan.size(), s);
    uint64_t at = 0, cols = 0, k = 0;
    for (uint32_t i = 0; i < s; ++i) {
      EXPECT_EQ(plan[i].id, (ShardId{i, s, at, 10007}));
      EXPECT_NEAR(double(plan[i].dim), 10007.0 / s, 1.0);
      at += plan[i].dim;
      cols += option(plan[i].spec, "cols");
      k += option(plan[i].spec, "k");
      EXPECT_EQ(option(plan[i].spec, "rows"), 3u);  // not a budget: every shard keeps it
      EXPECT_NO_THROW(make_compressor(plan[i].spec, plan[i].dim));
    }
    EXPECT_EQ(at, 10007u);
    EXPECT_EQ(cols, 1001u);  // S shards send what one server's job sends
    EXPECT_EQ(k, 97u);
  }
  // One shard is the job itself, in canonical form.
  EXPECT_EQ(plan_shards("topk:k=10", 100, 1)[0].spec, make_compressor("topk:k=10", 100)->spec());
}

TEST(ShardPlan, ALayoutIsCutAtTheTensorBoundariesNearestTheEvenCuts) {
  // 4 tensors: 600, 10, 300, 90 values.
  const std::string spec = "powersgd:rank=2,layout=20x30+10+30x10+90";
  const auto plan = plan_shards(spec, 1000, 2);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].dim, 600u);  // 600 is nearer to 500 than 610
  EXPECT_EQ(plan[1].id.begin, 600u);
  EXPECT_EQ(Registry::instance().parse(plan[0].spec).second.layout().text(), "20x30");
  EXPECT_EQ(Registry::instance().parse(plan[1].spec).second.layout().text(), "10+30x10+90");
  for (const auto& p : plan) EXPECT_NO_THROW(make_compressor(p.spec, p.dim));
  // Every shard holds a tensor, even where the even cuts would leave one empty.
  const auto four = plan_shards(spec, 1000, 4);
  std::vector<uint64_t> dims;
  for (const auto& p : four) dims.push_back(p.dim);
  EXPECT_EQ(dims, (std::vector<uint64_t>{600, 10, 300, 90}));
  EXPECT_THROW(plan_shards(spec, 1000, 5), InvalidArgument);  // 4 tensors
  // Shard 1 holds one bias: PowerSGD would send it whole and refuses to run on it alone; the
  // shard runs dense with the spec's momentum and wire format.
  const auto biases =
      plan_shards("powersgd:rank=2,momentum=0.9,wire=fp16,layout=20x30+10+30x10+90", 1000, 4);
  EXPECT_EQ(biases[1].spec, make_compressor("dense:momentum=0.9,wire=fp16", 10)->spec());
  EXPECT_EQ(biases[0].spec.rfind("powersgd:", 0), 0u);
}

TEST(ShardPlan, BadPlansAreRefused) {
  EXPECT_THROW(plan_shards("dense", 100, 0), InvalidArgument);
  EXPECT_THROW(plan_shards("dense", 3, 4), InvalidArgument);
  EXPECT_THROW(plan_shards("nosuch", 100, 2), InvalidArgument);
  EXPECT_THROW(plan_shards("powersgd:layout=10x10", 99, 2), InvalidArgument);  // layout ≠ dim
  // A small budget still leaves every shard one (a codec needs k ≥ 1).
  const auto plan = plan_shards("topk:k=2", 100, 4);
  for (const auto& p : plan) EXPECT_EQ(option(p.spec, "k"), 1u);
}

TEST(ShardPlan, SplitSpecRefusesCutsInsideTensorsAndEmptyParts) {
  const std::vector<uint64_t> inside{5, 95}, empty{0, 100}, good{50, 50};
  EXPECT_THROW(split_spec("topk:k=4,layout=10x5+50", inside), InvalidArgument);
  EXPECT_THROW(split_spec("topk:k=4", empty), InvalidArgument);
  EXPECT_THROW(split_spec("topk:k=4,layout=10x10", std::vector<uint64_t>{50, 49}), InvalidArgument);
  const auto parts = split_spec("topk:k=5", good);
  EXPECT_EQ(option(parts[0], "k") + option(parts[1], "k"), 5u);
}

/// A sketch's columns split in multiples of 4 (aligned windows) where the whole is one, still
/// adding up to the whole; an odd whole splits column by column as any budget does.
TEST(ShardPlan, SketchColumnsSplitInGroupsOfFour) {
  const std::vector<uint64_t> thirds{333, 333, 334};
  const auto parts = split_spec("sketch:k=900,cols=9000", thirds);
  uint64_t cols = 0, k = 0;
  for (const auto& p : parts) {
    EXPECT_EQ(option(p, "cols") % 4, 0u) << p;
    cols += option(p, "cols");
    k += option(p, "k");
  }
  EXPECT_EQ(cols, 9000u);
  EXPECT_EQ(k, 900u);
  const auto odd = split_spec("sketch:k=900,cols=9001", thirds);
  EXPECT_EQ(option(odd[0], "cols") + option(odd[1], "cols") + option(odd[2], "cols"), 9001u);
}

TEST(ShardPlan, EndpointListsSplitOnCommas) {
  EXPECT_EQ(split_endpoints("tcp://a:1"), std::vector<std::string>{"tcp://a:1"});
  EXPECT_EQ(split_endpoints("tcp://a:1, tcp://b:2"),
            (std::vector<std::string>{"tcp://a:1", "tcp://b:2"}));
  EXPECT_THROW(split_endpoints("tcp://a:1,,tcp://b:2"), InvalidArgument);
  EXPECT_THROW(split_endpoints(""), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::ps
