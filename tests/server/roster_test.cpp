// The roster on its own: which connection holds which rank, a federated round's slots in its
// sample's order, clients checked in ahead seated when their round opens, every slot freed at a
// round's end. (The Engine's tests drive it through whole jobs.)
#include <gtest/gtest.h>

#include <algorithm>

#include <sketchsgd/kernels/sample.hpp>
#include <sketchsgd/server/roster.hpp>

namespace sketchsgd::ps {
namespace {

TEST(Roster, ANewConnectionTakesTheRankFromTheOldOne) {
  Roster r(3, 0, 1);
  EXPECT_FALSE(r.federated());
  r.hold("a", 1, false).registered = true;
  EXPECT_EQ(r.rank_of("a"), 1u);
  auto& w = r.hold("b", 1, false);
  w.registered = true;
  EXPECT_EQ(w.peer, "b");
  EXPECT_EQ(r.rank_of("b"), 1u);
  EXPECT_FALSE(r.rank_of("a")) << "the replaced connection still maps to the rank";
  EXPECT_FALSE(r.waiting_slot("b"));
}

TEST(Roster, LiveCountsRegisteredWorkersNotDead) {
  Roster r(3, 0, 1);
  auto& a = r.hold("a", 0, false);
  a.registered = a.alive = true;
  auto& b = r.hold("b", 2, false);
  b.registered = true;  // counted dead
  EXPECT_EQ(r.live(), 1u);
}

TEST(Roster, SlotsFollowTheSampleOfTheRoundAndOfTheNext) {
  constexpr uint32_t kWorld = 4, kPopulation = 40;
  constexpr uint64_t kSeed = 7, kRound = 5;
  Roster r(kWorld, kPopulation, kSeed);
  EXPECT_TRUE(r.federated());
  r.sample(kRound);
  for (const bool ahead : {false, true}) {
    const auto sample = sample_clients(kPopulation, kWorld, kSeed, kRound + ahead);
    for (uint32_t i = 0; i < kWorld; ++i) EXPECT_EQ(r.slot_of(sample[i], ahead), i);
    uint32_t outside = 0;
    while (std::find(sample.begin(), sample.end(), outside) != sample.end()) ++outside;
    EXPECT_FALSE(r.slot_of(outside, ahead));
  }
}

TEST(Roster, ClientsCheckedInAheadTakeTheirSlotsWhenTheRoundOpens) {
  Roster r(3, 30, 1);
  auto& old = r.hold("now", 0, false);
  old.registered = true;
  auto& early = r.hold("early", 2, true);
  early.registered = early.behind = true;
  early.session = 42;
  auto& gone = r.hold("gone", 1, true);
  gone.registered = true;
  EXPECT_EQ(r.waiting_slot("early"), 2u);
  EXPECT_FALSE(r.rank_of("early")) << "checked in ahead is no rank of this round";
  r.leave_waiting(1);
  EXPECT_FALSE(r.waiting_slot("gone"));

  r.release();
  EXPECT_FALSE(r.rank_of("now"));
  EXPECT_FALSE(r[0].registered);
  const auto seated = r.seat_waiting();
  ASSERT_EQ(seated.size(), 1u);
  EXPECT_EQ(seated[0], std::make_pair(2u, true));  // it holds the model of the round before
  EXPECT_EQ(r.rank_of("early"), 2u);
  EXPECT_EQ(r[2].session, 42u);
  EXPECT_FALSE(r[2].behind) << "seated, it is a client of this round like any other";
  EXPECT_FALSE(r.waiting_slot("early"));
  EXPECT_FALSE(r.waiting(2).registered);
}

TEST(Roster, ForgettingCheckInsKeepsThisRoundsWorkers) {
  Roster r(2, 10, 1);
  r.hold("here", 0, false).registered = true;
  r.hold("ahead", 1, true).registered = true;
  r.forget_waiting();
  EXPECT_FALSE(r.waiting_slot("ahead"));
  EXPECT_TRUE(r.seat_waiting().empty());
  EXPECT_EQ(r.rank_of("here"), 0u);
}

}  // namespace
}  // namespace sketchsgd::ps
