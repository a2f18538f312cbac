// The simulator's CI tier: seeded fault schedules over every job kind and codec, the invariants
// checked after every event (tests/sim/invariants.cpp); the schedules that found bugs while it was
// written kept as regression cases; and the simulator's own test, that the invariants catch a
// job broken on purpose. The soak command (sketchsgd_sim) runs millions.
#include <gtest/gtest.h>

#include <sketchsgd/core/error.hpp>
#include "sim/sim.hpp"

namespace sketchsgd::ps::sim {
namespace {

std::string explain(Scenario s, uint64_t seed) {
  const Report r = shrink(s, seed);
  std::string out = "seed " + std::to_string(seed) + " (" + to_string(s.kind) + ", " + s.spec +
                    "): " + r.violation + "\n";
  for (const auto& line : r.trace) out += "  " + line + "\n";
  return out + "again: sketchsgd_sim --seeds 1 --first " + std::to_string(seed) + " --kind " +
         to_string(s.kind) + " --spec '" + s.spec + "' --trace\n";
}

class Search : public ::testing::TestWithParam<Kind> {};

TEST_P(Search, NoScheduleBreaksAnInvariant) {
  constexpr uint64_t kSeeds = 100;
  uint32_t finished = 0, faults = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    Scenario s = draw(seed, GetParam());
    const Report r = run(s, seed);
    if (!r.ok) FAIL() << explain(s, seed);
    finished += r.finished;
    faults += r.faults;
  }
  // The schedules did something, and most jobs still finished.
  EXPECT_GT(faults, 2 * kSeeds);
  EXPECT_GT(finished, kSeeds * 3 / 4);
}

INSTANTIATE_TEST_SUITE_P(Every, Search, ::testing::ValuesIn(kKinds),
                         [](const auto& info) { return std::string(to_string(info.param)); });

struct Found {
  Kind kind;
  const char* spec;
  uint64_t seed;
  const char* bug;
};

class Regression : public ::testing::TestWithParam<Found> {};

TEST_P(Regression, TheScheduleThatFoundABugKeepsEveryInvariant) {
  Scenario s = draw(GetParam().seed, GetParam().kind);
  s.spec = GetParam().spec;
  const Report r = run(s, GetParam().seed);
  EXPECT_TRUE(r.ok) << GetParam().bug << "\n" << explain(s, GetParam().seed);
}

// The seeds that found each bug (the schedule a seed draws changes with the simulator: each is
// kept as a case of the kind and codec it failed, under the schedule it draws today).
const Found kFound[] = {
    {Kind::Rounds, "sketch:k=20,cols=200,p2=2", 61,
     "a backup paused while its primary went on alone took over behind the workers"},
    {Kind::Rounds, "topk:k=30", 320,
     "a partitioned backup took over on one stale Hello while its primary served the others"},
    {Kind::Rounds, "powersgd:rank=2,layout=15x20", 2463,
     "a backup synced by a Sync could not resend the last outcome: PowerSGD's state forked"},
    {Kind::Rounds, "sketch:k=20,cols=200,fetch=1", 142,
     "a worker of a later epoch was refused by the last server left"},
    {Kind::Async, "topk:k=30", 3,
     "a Commit lost its pusher and push number: rank 0 refused for ever after a takeover"},
    {Kind::Async, "topk:k=30", 16, "a backup waited for a worker that had left"},
    {Kind::Async, "sketch:k=20,cols=200,fetch=1", 125,
     "a Sync carried no push numbers: a stale backup took over unseen"},
    {Kind::Async, "sketch:k=20,cols=200,fetch=1", 1105,
     "a promoted backup served one worker while the old primary served the others"},
    {Kind::Async, "sketch:k=20,cols=200,fetch=1", 121227,
     "a backup paused while its primary went on alone counted a Hello that had waited out the "
     "pause"},
    {Kind::Async, "sketch:k=20,cols=200,fetch=1", 250858,
     "a rank the backup had no push number of counted as not behind"},
    {Kind::Async, "topk:k=30", 400462,
     "a worker's promise to a probing backup lapsed while that backup was cut off after taking "
     "over: it went back to the old primary, whose pushes the backup then lacked"},
    {Kind::Quorum, "topk:k=30", 348453,
     "a backup counted a Hello held by a partition while its worker went back to the primary, "
     "applied the last round and left: the backup ran that round again without it"},
    {Kind::Stale, "topk:k=30", 3, "a push of a round ahead counted as a worker ahead"},
    {Kind::Restart, "dense", 77, "a server restarted without a checkpoint ran from round 0 again"},
    {Kind::Sharded, "sketch:k=20,cols=200,p2=2", 17019,
     "the simulator took a deposed primary's late end of a round, woken from a pause, for the "
     "round's outcome: a round closed without a dead worker's answer counted as whole"},
    {Kind::Federated, "topk:k=30", 77,
     "a server killed before its first round's checkpoint landed came back without a model, and "
     "no client left held one"},
    {Kind::Federated, "topk:k=30", 41840,
     "a client whose push a restart lost pushed again with that push's error feedback in"},
    {Kind::Federated, "dense", 114607,
     "a server restarted from an older checkpoint ran the round before again with another "
     "client's push, and the next round's clients sent pushes computed on the old model"},
};

INSTANTIATE_TEST_SUITE_P(Seeds, Regression, ::testing::ValuesIn(kFound), [](const auto& info) {
  return std::string(to_string(info.param.kind)) + std::to_string(info.param.seed);
});

TEST(Sim, ASeedReproducesItsRunExactly) {
  const Scenario s = draw(7);
  const Report a = run(s, 7, true), b = run(s, 7, true);
  EXPECT_EQ(a.trace, b.trace);
  EXPECT_EQ(a.events, b.events);
  EXPECT_GT(a.events, 100u);
}

TEST(Sim, AnUpdateAppliedTwiceIsCaught) {
  for (Kind k : {Kind::Rounds, Kind::Sharded}) {
    Scenario s = draw(5, k);
    s.faults = 0;
    s.sabotage = Scenario::Sabotage::Corrupt;
    const Report r = run(s, 5);
    EXPECT_FALSE(r.ok) << to_string(k);
    EXPECT_NE(r.violation.find("a model no server had"), std::string::npos) << r.violation;
  }
}

TEST(Sim, AWorkerStuckWithoutAFaultIsCaught) {
  Scenario s = draw(5, Kind::Rounds);
  s.faults = 0;
  s.sabotage = Scenario::Sabotage::Stall;
  const Report r = run(s, 5);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.violation.find("no progress"), std::string::npos) << r.violation;
}

TEST(Sim, AFailingScheduleIsCutDownToTheFaultsItNeeds) {
  Scenario s = draw(5, Kind::Rounds);
  s.faults = 6;
  s.sabotage = Scenario::Sabotage::Corrupt;  // fails with no fault at all
  const Report r = shrink(s, 5);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.faults, 0u);
  EXPECT_EQ(s.skip, (uint64_t(1) << 6) - 1);
  EXPECT_GT(r.trace.size(), 5u) << "the trace of the cut-down run";
  for (const auto& line : r.trace) EXPECT_EQ(line.find("FAULT"), std::string::npos) << line;
}

TEST(Sim, UnknownKindsAreRefused) {
  EXPECT_EQ(parse_kind("async"), Kind::Async);
  EXPECT_THROW(parse_kind("nonsense"), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd::ps::sim
