// The codec registry: every codec built from its spec, canonical specs, clear errors, and
// budgets scaled for a share of a model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

TEST(Registry, BuildsEveryCodecAndCanonicalSpecRoundTrips) {
  for (const auto& spec : example_specs(Layout::parse("20x40+200"))) {
    auto c = make_compressor(spec, 1000);
    auto again = make_compressor(c->spec(), 1000);
    EXPECT_EQ(again->spec(), c->spec()) << spec;
    EXPECT_EQ(again->id(), c->id());
  }
  EXPECT_EQ(make_compressor("topk:k=10", 1000)->spec(),
            "topk:k=10,global=0,ef=1,momentum=0,index=u32,wire=fp32,budget=global,dense_below=0,"
            "reduce=gather");
  EXPECT_GE(Registry::instance().entries().size(), 7u);
  // Every codec registers examples, each of its own name and without a layout (example_specs()
  // adds one); a layout-free listing leaves out only the codecs that require one.
  size_t free = 0;
  for (const CodecEntry* e : Registry::instance().entries()) {
    ASSERT_FALSE(e->examples.empty()) << e->name;
    for (const CodecExample& x : e->examples) {
      EXPECT_EQ(x.spec.substr(0, x.spec.find(':')), e->name);
      EXPECT_EQ(x.spec.find("layout="), std::string::npos) << x.spec;
      EXPECT_TRUE(std::isfinite(x.lr) && x.lr > 0) << x.spec;
    }
    if (e->layout != LayoutUse::Required) free += e->examples.size();
  }
  EXPECT_EQ(example_specs().size(), free);
}

TEST(Registry, ClearErrors) {
  auto message = [](const std::string& spec, uint64_t dim = 1000) {
    try {
      make_compressor(spec, dim);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string known = "known: ";  // every registered codec, in name order
  for (const CodecEntry* e : Registry::instance().entries())
    known += (known.size() > 7 ? ", " : "") + e->name;
  EXPECT_NE(message("zip").find(known), std::string::npos) << message("zip");
  EXPECT_NE(message("topk:kk=3").find("unknown option 'kk'"), std::string::npos);
  EXPECT_NE(message("topk:kk=3").find("global=<int>"), std::string::npos);  // lists accepted
  EXPECT_NE(message("topk:k=").find("no value"), std::string::npos);
  EXPECT_NE(message("topk:k").find("not key=value"), std::string::npos);
  EXPECT_NE(message("topk:k=abc").find("not a number"), std::string::npos);
  EXPECT_NE(message("topk:k=1.5").find("must be an integer"), std::string::npos);
  EXPECT_NE(message("topk:k=1,k=2").find("given twice"), std::string::npos);
  EXPECT_NE(message("sketch:momentum=1.5").find("outside [0, 0.999]"), std::string::npos);
  EXPECT_NE(message("topk:k=1001").find("exceeds dim"), std::string::npos);
  EXPECT_NE(message("sketch:k=5000").find("exceeds dim"), std::string::npos);
  EXPECT_NE(message("sketch:k=10,p2=2,fetch=1").find("no second round"), std::string::npos);
  EXPECT_NE(message("dense", 0).find("dim"), std::string::npos);
  EXPECT_NE(message("topk:k=nan").find("not a number"), std::string::npos);
}

/// A part of the model gets its share of the budgets (k, cols), rounded half to even and at
/// least 1; 0 (the codec's default) stays; other options and the canonical form are kept.
TEST(Registry, ShareSpecScalesOnlyBudgets) {
  EXPECT_EQ(share_spec("sketch:k=1000,cols=90001,rows=3", 0.25),
            make_compressor("sketch:k=250,cols=22500,rows=3", 1000000)->spec());
  EXPECT_EQ(share_spec("topk:k=10", 0.25), make_compressor("topk:k=2", 1000)->spec());  // 2.5
  EXPECT_EQ(share_spec("topk:k=10", 0.35), make_compressor("topk:k=4", 1000)->spec());  // 3.5
  EXPECT_EQ(share_spec("topk:k=10", 0.01), make_compressor("topk:k=1", 1000)->spec());
  EXPECT_EQ(share_spec("topk", 0.5), make_compressor("topk", 1000)->spec());  // k=0: default
  EXPECT_EQ(share_spec("powersgd:rank=4", 0.1),
            "powersgd:rank=4,momentum=0,min_rate=2,ef=1,"
            "warm=1,seed=1,blocks=1,wire=fp32");
  EXPECT_EQ(share_spec(" qsgd:bits=2 "), make_compressor("qsgd:bits=2", 1000)->spec());
  // A sketch's share of columns is a multiple of 4 (its windows align) once it holds 4; k is not.
  EXPECT_EQ(share_spec("sketch:k=1000,cols=90000", 0.4313),
            make_compressor("sketch:k=431,cols=38816", 1000000)->spec());  // 38,817 columns exactly
  EXPECT_EQ(share_spec("sketch:k=1000,cols=10", 0.3),
            make_compressor("sketch:k=300,cols=3", 1000000)->spec());
  EXPECT_EQ(share_spec("sketch:k=1000,cols=90001"),
            make_compressor("sketch:k=1000,cols=90001", 1000000)->spec());
  EXPECT_THROW(share_spec("topk:k=10", 0.0), InvalidArgument);
  EXPECT_THROW(share_spec("topk:k=10", 1.5), InvalidArgument);
  EXPECT_THROW(share_spec("topk:kk=10", 0.5), InvalidArgument);
  EXPECT_THROW(share_spec("nosuch", 0.5), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd
