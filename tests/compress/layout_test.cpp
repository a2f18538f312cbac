// Tensor layouts: the text form in specs, and the one split every codec and the DDP hook use
// (partition, merged runs, shares of a budget).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include <sketchsgd/compress/layout.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>

namespace sketchsgd {
namespace {

TEST(Layout, ParsesPrintsAndRefusesBadText) {
  const Layout l = Layout::parse("1024x784+1024+10x2x5+3");
  ASSERT_EQ(l.tensors().size(), 4u);
  EXPECT_EQ(l.size(), 1024u * 784 + 1024 + 100 + 3);
  EXPECT_EQ(l.tensors()[2].offset, 1024u * 784 + 1024);
  EXPECT_EQ(l.tensors()[2].rows, 10u);  // matrix view: first dimension × the rest
  EXPECT_EQ(l.tensors()[2].cols, 10u);
  EXPECT_EQ(l.tensors()[1].cols, 1u);
  EXPECT_EQ(l.text(), "1024x784+1024+10x2x5+3");
  EXPECT_EQ(Layout::parse(l.text()), l);
  for (const char* bad : {"", "+", "3+", "3x", "x3", "3++4", "3x0", "3,4", "3 x 4", "-3",
                          "99999999999", "70000x70000"})
    EXPECT_THROW(Layout::parse(bad), InvalidArgument) << bad;
}

TEST(Layout, IsPartOfTheCanonicalSpecAndMustFitTheVector) {
  const auto c = make_compressor("powersgd:rank=2,layout=40x50+10", 2010);
  EXPECT_NE(c->spec().find(",layout=40x50+10"), std::string::npos) << c->spec();
  // Rebuilt from its canonical spec: the same codec.
  EXPECT_EQ(make_compressor(c->spec(), 2010)->spec(), c->spec());
  EXPECT_EQ(make_compressor("powersgd:rank=2", Layout({{40, 50}, {10}}))->spec(), c->spec());
  EXPECT_THROW(make_compressor("powersgd:rank=2,layout=40x50+10", 2000), InvalidArgument);
  EXPECT_THROW(make_compressor("powersgd:rank=2", 2010), InvalidArgument);  // needs one
  EXPECT_THROW(make_compressor("powersgd:layout=4x5,layout=4x5", 20), InvalidArgument);
  EXPECT_THROW(make_compressor("powersgd:rank=2,layout=4x5", Layout({{4, 5}})), InvalidArgument);
  EXPECT_THROW(make_compressor("dense:layout=4x5", 20), InvalidArgument);  // uses none
  // Nothing worth compressing at this rank: refused with a reason.
  EXPECT_THROW(make_compressor("powersgd:rank=4,layout=8x8+8", 72), InvalidArgument);
}

TEST(Layout, CompressesAnyTellsWhatTheCodecWouldRefuse) {
  // PowerSGD factors a matrix where (rows + cols)·rank·min_rate < rows·cols.
  EXPECT_FALSE(compresses_any("powersgd:rank=4", Layout({{8, 8}, {8}})));
  EXPECT_FALSE(compresses_any("powersgd:rank=4", Layout({{3, 256}, {3}})));  // a 3-class head
  EXPECT_TRUE(compresses_any("powersgd:rank=1", Layout({{3, 256}, {3}})));
  EXPECT_TRUE(compresses_any("powersgd:rank=4", Layout({{3, 256}, {64, 64}})));
  EXPECT_FALSE(compresses_any("powersgd:rank=4,min_rate=40", Layout({{64, 64}})));
  EXPECT_FALSE(compresses_any("powersgd:rank=2", Layout::parse("1000")));  // no matrix at all
  // blocks=B: the B chunks' rows make one matrix (3 × 256 as two 3-row chunks: 6 × 256).
  EXPECT_FALSE(compresses_any("powersgd:rank=2", Layout({{3, 256}})));
  EXPECT_TRUE(compresses_any("powersgd:rank=2,blocks=2", Layout({{3, 256}, {3, 256}})));
  // What it says is what building does.
  for (const char* spec : {"powersgd:rank=4", "powersgd:rank=1", "powersgd:rank=2,blocks=2"})
    for (const Layout& l : {Layout({{3, 256}, {3, 256}}), Layout({{8, 8}, {8, 8}})}) {
      bool built = true;
      try {
        make_compressor(spec, l);
      } catch (const InvalidArgument&) {
        built = false;
      }
      EXPECT_EQ(compresses_any(spec, l), built) << spec << " " << l.text();
    }
  // Codecs that read no layout, or take it as an option, compress anything.
  EXPECT_TRUE(compresses_any("dense", Layout({{8, 8}})));
  EXPECT_TRUE(compresses_any("topk:k=2", Layout({{8, 8}})));
  EXPECT_THROW(compresses_any("powersgd:rank=4,layout=8x8", Layout({{8, 8}})), InvalidArgument);
  EXPECT_THROW(compresses_any("nosuch", Layout({{8, 8}})), InvalidArgument);
  EXPECT_THROW(compresses_any("powersgd:rank=2,blocks=2", Layout({{3, 256}})), InvalidArgument);
  EXPECT_THROW(compresses_any("powersgd:rank=2", Layout()), InvalidArgument);
}

TEST(Layout, PartitionKeepsOrderAndMergesNeighbours) {
  const Layout l({{40, 50}, {40}, {10}, {30, 20}, {5}, {8, 8}});  // 2000 40 10 600 5 64
  const auto s = l.partition([](const Layout::Tensor& t) { return Layout::sent_whole(t, 100); });
  ASSERT_EQ(s.kept.size(), 2u);
  EXPECT_EQ(s.kept[0].offset, 0u);
  EXPECT_EQ(s.kept[1].offset, 2050u);
  EXPECT_EQ(s.whole.size(), 4u);  // the three 1-D tensors and the 8 x 8 matrix (< 100 values)
  EXPECT_EQ(s.kept_size, 2000u + 600);
  EXPECT_EQ(s.whole_size, 40u + 10 + 5 + 64);
  EXPECT_EQ(s.kept_size + s.whole_size, l.size());
  const auto whole = Layout::Split::runs(s.whole);  // 40 + 10 adjacent; 5 + 64 adjacent
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0].offset, 2000u);
  EXPECT_EQ(whole[0].numel, 50u);
  EXPECT_EQ(whole[1].offset, 2650u);
  EXPECT_EQ(whole[1].numel, 69u);
  const auto kept = Layout::Split::runs(s.kept);
  ASSERT_EQ(kept.size(), 2u);  // 0..2000 and 2050..2650: not neighbours
  EXPECT_EQ(kept[1].numel, 600u);
  // Everything whole, or nothing: one side empty.
  const auto all = l.partition([](const Layout::Tensor&) { return true; });
  EXPECT_TRUE(all.kept.empty());
  EXPECT_EQ(Layout::Split::runs(all.whole).size(), 1u);
  EXPECT_TRUE(Layout().partition([](const Layout::Tensor&) { return false; }).kept.empty());
}

TEST(Layout, MergeJoinsOnlyRunsThatTouch) {
  const std::vector<Layout::Run> in{{0, 4}, {4, 6}, {11, 1}, {12, 3}, {20, 1}};
  const auto out = Layout::merge(in);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].numel, 10u);
  EXPECT_EQ(out[1].offset, 11u);
  EXPECT_EQ(out[1].numel, 4u);
  EXPECT_EQ(out[2].offset, 20u);
  EXPECT_TRUE(Layout::merge({}).empty());
}

TEST(Layout, SharesAddUpToKByLargestRemainder) {
  const Layout l({{40, 50}, {20, 20}, {3}});
  const auto s = l.partition([](const Layout::Tensor& t) { return t.dims < 2; });
  auto total = [](const std::vector<uint64_t>& v) {
    return std::accumulate(v.begin(), v.end(), 0ull);
  };
  EXPECT_EQ(s.shares(120), (std::vector<uint64_t>{100, 20}));  // exact proportions
  EXPECT_EQ(s.shares(7), (std::vector<uint64_t>{6, 1}));       // 5.83 + 1.17: the larger rest
  EXPECT_EQ(total(s.shares(1)), 1u);
  EXPECT_EQ(s.shares(5000), (std::vector<uint64_t>{2000, 400}));  // capped at every tensor
  EXPECT_EQ(s.shares(0), (std::vector<uint64_t>{0, 0}));
  // Equal remainders: the earlier tensor first.
  const Layout twins({{10, 10}, {10, 10}});
  const auto t = twins.partition([](const Layout::Tensor&) { return false; });
  EXPECT_EQ(t.shares(3), (std::vector<uint64_t>{2, 1}));
}

}  // namespace
}  // namespace sketchsgd
