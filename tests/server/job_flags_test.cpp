// The job flags' one table (server/job_flags.hpp): what a program declares from it is read into a
// JobConfig with the same checks in every program.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/server/job_flags.hpp>

namespace sketchsgd::ps {
namespace {

/// f parsed from args (after a program name).
void parse(Flags& f, std::vector<std::string> args) {
  args.insert(args.begin(), "program");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ASSERT_TRUE(f.parse(int(argv.size()), argv.data()));
}

/// The InvalidArgument's text that reading these flags gives ("" for none).
std::string error_of(std::vector<std::string> args) {
  Flags f("test");
  JobFlags job;
  job.add(f, job_flag_names());
  parse(f, std::move(args));
  JobConfig c;
  try {
    job.read(f, c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(JobFlags, ReadsWhatAProgramDeclaredWithItsOwnDefaults) {
  Flags f("test");
  JobFlags job;
  job.add(f, {"mode", "deadline-ms", "staleness", "shards", "shard"}, {{"deadline-ms", "60000"}});
  parse(f, {"--staleness", "2", "--shards", "2", "--shard", "1"});
  JobConfig c;
  c.dim = 1000;
  c.spec = "topk:k=10";
  c.lr = 0.5f;  // --lr was not declared: the program's own value stays
  job.read(f, c);
  EXPECT_EQ(c.deadline, Millis(60000));
  EXPECT_EQ(c.staleness(), 2u);
  EXPECT_FALSE(c.async());
  EXPECT_EQ(c.lr, 0.5f);
  // The second of two shards: its range and its share of the codec.
  EXPECT_EQ(c.shard.index, 1u);
  EXPECT_EQ(c.shard.count, 2u);
  EXPECT_EQ(c.shard.model_dim, 1000u);
  EXPECT_EQ(c.dim, 500u);
  EXPECT_EQ(c.spec.rfind("topk:k=5,", 0), 0u) << c.spec;
}

TEST(JobFlags, AnAsynchronousJobHasNoRoundPolicy) {
  Flags f("test");
  JobFlags job;
  job.add(f, {"mode", "policy", "max-age"});
  parse(f, {"--mode", "async", "--policy", "abort", "--max-age", "4"});
  JobConfig c;
  job.read(f, c);
  EXPECT_TRUE(c.async());
  EXPECT_EQ(c.policy(), Policy::Wait);
  EXPECT_EQ(c.max_age(), 4u);
  EXPECT_TRUE(c.age_scaled());
}

// The flags make one of the three modes, with the fields of that mode alone.
TEST(JobFlags, TheFlagsMakeOneMode) {
  const auto read = [](std::vector<std::string> args) {
    Flags f("test");
    JobFlags job;
    job.add(f, {"mode", "policy", "min-workers", "staleness", "population", "sample-seed",
                "max-age", "age-scale", "world"});
    parse(f, args);
    JobConfig c;
    job.read(f, c);
    return c;
  };
  const JobConfig sync =
      read({"--world", "4", "--policy", "quorum", "--min-workers", "3", "--staleness", "2"});
  ASSERT_TRUE(std::holds_alternative<SyncMode>(sync.mode));
  EXPECT_EQ(sync.policy(), Policy::Quorum);
  EXPECT_EQ(sync.min_workers(), 3u);
  EXPECT_EQ(sync.staleness(), 2u);
  const JobConfig fed =
      read({"--world", "4", "--population", "40", "--sample-seed", "7", "--policy", "abort"});
  ASSERT_TRUE(fed.federated());
  EXPECT_EQ(fed.population(), 40u);
  EXPECT_EQ(fed.sample_seed(), 7u);
  EXPECT_EQ(fed.policy(), Policy::Abort);
  EXPECT_EQ(fed.staleness(), 0u);
  const JobConfig async = read({"--mode", "async", "--age-scale", "0"});
  ASSERT_TRUE(async.async());
  EXPECT_FALSE(async.age_scaled());
  EXPECT_EQ(async.population(), 0u);
  // A mode's fields alone: what another mode would need is refused naming its flag.
  EXPECT_THROW(read({"--mode", "async", "--population", "40"}), InvalidArgument);
  EXPECT_THROW(read({"--world", "4", "--population", "40", "--staleness", "1"}), InvalidArgument);
}

TEST(JobFlags, EveryBadValueIsRefusedNamingItsFlag) {
  EXPECT_EQ(error_of({"--dim", "10"}), "");
  EXPECT_NE(error_of({}).find("--dim is required"), std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--world", "0"}).find("--world"), std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--codec", "zip"}).find("--codec zip"), std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--mode", "x"}).find("--mode"), std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--max-age", "3"}).find("--max-age"), std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--mode", "async", "--staleness", "1"}).find("--staleness"),
            std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--shards", "2", "--shard", "2"}).find("--shard 2"),
            std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--outer-momentum", "1"}).find("--outer-momentum"),
            std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--outer-nesterov", "2"}).find("--outer-nesterov"),
            std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--opt-betas", "0.9"}).find("--opt-betas"), std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--server-opt", "rmsprop"}).find("--server-opt"),
            std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--policy", "x"}).find("--policy"), std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--min-workers", "2"}).find("--min-workers"),
            std::string::npos);
  EXPECT_NE(error_of({"--dim", "10", "--device", "tpu"}).find("--device"), std::string::npos);
}

TEST(JobFlags, ANameTheTableDoesNotHoldIsRefused) {
  Flags f("test");
  JobFlags job;
  EXPECT_THROW(job.add(f, {"mode", "modes"}), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::ps
