// Round: a unit's exchange through collectives, driven here by an in-process "group" (sums in rank
// order from zero, gathers by copying), against the parameter server's path through messages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/round.hpp>
#include <sketchsgd/compress/sparse_reduce.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "compress/sparse_sum.hpp"
#include "compress/summable.hpp"
#include "support/helpers.hpp"
#include "support/round.hpp"

namespace sketchsgd {
namespace {

constexpr uint32_t kRanks = 3;
constexpr uint64_t kDim = 5000;  // what the codec compresses
constexpr uint64_t kWhole = 70;  // what goes whole beside it

std::vector<float> grad(uint32_t rank, uint64_t round, uint64_t n = kDim) {
  auto g = test::gaussian(n, 1000 * round + rank + (n == kDim ? 0 : 77));
  for (uint32_t j = 0; j < 40 && n == kDim; ++j)
    g[(j * 97 + round) % kDim] += 8.0f * (j % 2 ? -1.0f : 1.0f);
  return g;
}

/// kRanks ranks, each with its codec, its aggregator replica, its rooms and its Round.
struct Group {
  std::vector<std::unique_ptr<Compressor>> codecs;
  std::vector<std::unique_ptr<Aggregator>> aggregators;
  std::vector<std::vector<float>> payload, answer;
  std::vector<std::unique_ptr<Round>> rounds;
  std::vector<std::vector<float>> steps, wholes;
  // Where the unit lies in each rank's buffer: end to end, or interleaved (the compressed values
  // in two runs with the whole ones between them, as a DDP bucket holds a layer's weight, bias
  // and the next weight).
  std::vector<Layout::Run> kept, whole_runs;

  Group(const std::string& spec, uint64_t whole, bool interleaved = false)
      : payload(kRanks), answer(kRanks) {
    if (interleaved) {
      kept = {{0, 2000}, {2000 + whole, kDim - 2000}};
      whole_runs = {{2000, whole}};
    } else {
      kept = {{0, kDim}};
      whole_runs = {{kDim, whole}};
    }
    for (uint32_t r = 0; r < kRanks; ++r) {
      codecs.push_back(make_compressor(spec, kDim));
      aggregators.push_back(codecs[r]->make_aggregator(kRanks));
      payload[r].resize(Round::payload_size(codecs[r].get(), whole));
      answer[r].resize(Round::answer_size(codecs[r].get()));
      rounds.push_back(std::make_unique<Round>(*codecs[r], *aggregators[r], r, whole,
                                               Round::Rooms{payload[r], answer[r]}));
    }
    steps.assign(kRanks, std::vector<float>(kDim));
    wholes.assign(kRanks, std::vector<float>(whole));
  }

  /// x and whole laid out in a buffer at the runs, and taken back out of it.
  std::vector<float> place(const std::vector<float>& x, const std::vector<float>& whole) const {
    std::vector<float> buf(x.size() + whole.size());
    uint64_t at = 0;
    for (const auto& run : kept)
      for (uint64_t j = 0; j < run.numel; ++j) buf[run.offset + j] = x[at++];
    at = 0;
    for (const auto& run : whole_runs)
      for (uint64_t j = 0; j < run.numel; ++j) buf[run.offset + j] = whole[at++];
    return buf;
  }
  void take(const std::vector<float>& buf, std::vector<float>& x, std::vector<float>& whole) const {
    uint64_t at = 0;
    for (const auto& run : kept)
      for (uint64_t j = 0; j < run.numel; ++j) x[at++] = buf[run.offset + j];
    at = 0;
    for (const auto& run : whole_runs)
      for (uint64_t j = 0; j < run.numel; ++j) whole[at++] = buf[run.offset + j];
  }

  std::vector<float>& room(uint32_t r, int which) { return which ? answer[r] : payload[r]; }

  /// Runs one phase's requests "collectively"; returns what each rank takes back, in the order
  /// Round::next() takes it: every rank's gathered bytes (the same for every rank), and each
  /// rank's part for it from an exchange.
  std::vector<std::vector<std::vector<uint8_t>>> run(
      const std::vector<std::vector<Round::Request>>& reqs) {
    const size_t n = reqs[0].size();
    for (const auto& q : reqs) EXPECT_EQ(q.size(), n);
    std::vector<std::vector<std::vector<uint8_t>>> all(kRanks);
    for (size_t i = 0; i < n; ++i) {
      if (reqs[0][i].op == Round::Op::Sum) {
        const Round::Request& q = reqs[0][i];
        const size_t lo = q.offset, hi = q.count ? q.offset + q.count : room(0, q.room).size();
        std::vector<float> sum(hi - lo, 0.0f);
        for (uint32_t r = 0; r < kRanks; ++r) {
          EXPECT_EQ(reqs[r][i].offset, q.offset);
          EXPECT_EQ(reqs[r][i].count, q.count);
          const auto& v = room(r, q.room);
          for (size_t j = lo; j < hi; ++j) sum[j - lo] += v[j];
        }
        for (uint32_t r = 0; r < kRanks; ++r)
          std::copy(sum.begin(), sum.end(), room(r, q.room).begin() + ptrdiff_t(lo));
      } else if (reqs[0][i].op == Round::Op::Exchange) {
        for (uint32_t to = 0; to < kRanks; ++to)
          for (uint32_t from = 0; from < kRanks; ++from) {
            const auto& part = reqs[from][i].parts.at(to);
            EXPECT_EQ(part.size(), reqs[0][i].parts[0].size());
            all[to].emplace_back(part.begin(), part.end());
          }
      } else {
        for (uint32_t r = 0; r < kRanks; ++r) {
          EXPECT_EQ(reqs[r][i].bytes.size(), reqs[0][i].bytes.size());
          for (uint32_t to = 0; to < kRanks; ++to)
            all[to].emplace_back(reqs[r][i].bytes.begin(), reqs[r][i].bytes.end());
        }
      }
    }
    return all;
  }

  static std::vector<std::span<const uint8_t>> spans(const std::vector<std::vector<uint8_t>>& v) {
    return {v.begin(), v.end()};
  }

  /// One step on every rank: x[r] and whole[r] in, steps and wholes out. Every rank's error,
  /// if any, as text ("" where none). shared: a gathered round's update reduced by rank 0 alone
  /// and finished from by every rank (a simulated group's path).
  std::vector<std::string> step(const std::vector<std::vector<float>>& x,
                                const std::vector<std::vector<float>>& whole, uint64_t round,
                                bool shared = false) {
    std::vector<std::string> errors(kRanks);
    std::vector<std::vector<Round::Request>> reqs(kRanks);
    std::vector<std::vector<float>> buffers(kRanks);
    for (uint32_t r = 0; r < kRanks; ++r) {
      buffers[r] = place(x[r], whole[r]);
      reqs[r] = rounds[r]->start(buffers[r], {kept, whole_runs}, round);
    }
    for (int phase = 1;; ++phase) {
      const auto got = run(reqs);
      std::vector<std::vector<Round::Request>> next(kRanks);
      Message update;
      if (shared && phase == rounds[0]->phases() && rounds[0]->gathered()) {
        try {
          update = rounds[0]->reduce(spans(got[0]));
        } catch (const Error& e) {
          errors.assign(kRanks, e.what());
          break;
        }
      }
      for (uint32_t r = 0; r < kRanks; ++r) {
        const auto gathered = spans(got[r]);
        try {
          if (phase == rounds[r]->phases() && !update.bytes().empty()) {
            rounds[r]->finish_update(update.bytes(), buffers[r], {kept, whole_runs});
            take(buffers[r], steps[r], wholes[r]);
          } else if (phase == rounds[r]->phases()) {
            rounds[r]->finish(gathered, buffers[r], {kept, whole_runs});
            take(buffers[r], steps[r], wholes[r]);
          } else
            next[r] = rounds[r]->next(gathered);
        } catch (const Error& e) {
          errors[r] = e.what();
        }
      }
      if (phase == rounds[0]->phases()) break;
      for (const auto& e : errors)
        if (!e.empty()) return errors;  // no rank goes on alone
      reqs = std::move(next);
    }
    return errors;
  }
};

/// The registry's examples of codecs whose sums travel in fp32 (a 16-bit wire is summed in its
/// format by a collective: like messages only to rounding) and every gathered one.
std::vector<std::string> fp32_examples() {
  std::vector<std::string> out{"powersgd:rank=2,ef=0,warm=0,layout=50x80+1000"};
  for (const auto& spec : example_specs(Layout::parse("50x80+1000"))) {
    const auto c = make_compressor(spec, kDim);
    if (c->sum_format(MessageKind::Gradient) == WireFloat::F32) out.push_back(spec);
  }
  return out;
}

class Rounds : public ::testing::TestWithParam<std::string> {};

void same_as_the_parameter_server(Group&& group);

// The same steps and states as W workers and a parameter server exchanging messages, and the
// whole tensors' mean as the aggregators average: sum times float32(1/W).
TEST_P(Rounds, GiveTheParameterServersStepsBitForBit) {
  for (const bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "end to end");
    same_as_the_parameter_server(Group(GetParam(), kWhole, interleaved));
  }
}

void same_as_the_parameter_server(Group&& group) {
  test::Job ps(group.codecs[0]->spec(), kDim, kRanks);
  const float inv = 1.0f / float(kRanks);
  // The sparse all-reduce keeps at most a rank's budget: the server's union of every rank's list
  // where the ranks' lists coincide (SparseRound has the rest).
  const bool sparse = group.rounds[0]->sparse();
  for (uint64_t round = 0; round < 4; ++round) {
    std::vector<std::vector<float>> x(kRanks), whole(kRanks);
    for (uint32_t r = 0; r < kRanks; ++r) {
      x[r] = grad(sparse ? 0 : r, round);
      whole[r] = grad(r, round, kWhole);
    }
    const auto errors = group.step(x, whole, round);
    for (const auto& e : errors) ASSERT_EQ(e, "");
    const auto expected = ps.round(x, round);
    std::vector<float> mean(kWhole, 0.0f);
    for (uint32_t r = 0; r < kRanks; ++r)
      for (uint64_t j = 0; j < kWhole; ++j) mean[j] += whole[r][j];
    for (auto& v : mean) v *= inv;
    for (uint32_t r = 0; r < kRanks; ++r) {
      ASSERT_EQ(std::memcmp(group.steps[r].data(), expected[r].data(), kDim * sizeof(float)), 0)
          << "round " << round << " rank " << r;
      ASSERT_EQ(std::memcmp(group.wholes[r].data(), mean.data(), kWhole * sizeof(float)), 0);
    }
  }
  for (uint32_t r = 0; r < kRanks; ++r)
    EXPECT_EQ(group.codecs[r]->save_state(), ps.workers[r]->save_state()) << "rank " << r;
  EXPECT_EQ(group.aggregators[0]->save_state(), ps.server->save_state());
}

/// Three steps; before step 1, spoil(x, whole) corrupts a copy of the inputs and check(errors)
/// reads every rank's error of that step; every step then runs clean and every rank agrees.
template <class Spoil, class Check>
void a_bad_step_then_clean_ones(Group& group, Spoil&& spoil, Check&& check) {
  for (uint64_t round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> x(kRanks), whole(kRanks);
    for (uint32_t r = 0; r < kRanks; ++r) {
      x[r] = grad(r, round);
      whole[r] = grad(r, round, kWhole);
    }
    if (round == 1) {
      auto bad_x = x, bad_whole = whole;
      spoil(bad_x, bad_whole);
      check(group.step(bad_x, bad_whole, round));
    }
    for (const auto& e : group.step(x, whole, round)) ASSERT_EQ(e, "");
    for (uint32_t r = 1; r < kRanks; ++r) {
      ASSERT_EQ(group.steps[r], group.steps[0]) << "round " << round;
      ASSERT_EQ(group.wholes[r], group.wholes[0]) << "round " << round;
      ASSERT_EQ(group.aggregators[r]->save_state(), group.aggregators[0]->save_state());
    }
  }
}

// A rank whose gradient is not finite: every rank raises NonFiniteError in the same phase (no
// one waits for another), that rank's codec state is as before (the others' encodes succeeded:
// their error feedback holds this step's gradient), and the next steps run and agree.
TEST_P(Rounds, ANonFiniteRankStopsEveryRankAndTheNextStepGoesOn) {
  Group group(GetParam(), kWhole);
  Bytes before;
  a_bad_step_then_clean_ones(
      group,
      [&](auto& x, auto&) {
        x[2][123] = std::numeric_limits<float>::quiet_NaN();
        before = group.codecs[2]->save_state();
      },
      [&](const std::vector<std::string>& errors) {
        for (uint32_t r = 0; r < kRanks; ++r)
          EXPECT_NE(errors[r].find(r == 2 ? "123" : "not finite"), std::string::npos)
              << "rank " << r << ": " << errors[r];
        // PowerSGD's fused CPU pass takes its error back by subtraction ((e + g) − g): as before
        // only to rounding (a known limit of that codec, not of the round).
        if (GetParam().rfind("powersgd", 0) != 0) EXPECT_EQ(group.codecs[2]->save_state(), before);
      });
}

// The same where the value that is not finite is in a tensor sent whole (a bias): checked before
// the encode, so that rank's codec state is as before; the others raise naming another rank.
TEST_P(Rounds, ANonFiniteWholeTensorStopsEveryRankAndTheNextStepGoesOn) {
  Group group(GetParam(), kWhole, true);
  Bytes before;
  a_bad_step_then_clean_ones(
      group,
      [&](auto&, auto& whole) {
        whole[1][5] = std::numeric_limits<float>::infinity();
        before = group.codecs[1]->save_state();
      },
      [&](const std::vector<std::string>& errors) {
        for (uint32_t r = 0; r < kRanks; ++r)
          EXPECT_NE(errors[r].find(r == 1 ? "coordinate 2005" : "not finite"), std::string::npos)
              << "rank " << r << ": " << errors[r];
        EXPECT_EQ(group.codecs[1]->save_state(), before);
      });
}

// wire=int8: each Sum names its format and the columns its scales go by (the driver's to run,
// wire.hpp); the values sent as they are (the codec's 1-D tensor, the unit's tensors sent whole)
// are a Sum of their own in I8 with one column (scales of their own), over the room's values
// after the factors; a whole-only unit's
// sum stays float32.
TEST(Round, AnInt8CodecAsksForItsSumsInInt8ByColumn) {
  Group group("powersgd:rank=3,wire=int8,layout=50x80+1000", kWhole);
  std::vector<std::vector<float>> buffers(kRanks);
  std::vector<std::vector<Round::Request>> reqs(kRanks);
  // The layout's 1000-value tensor is sent as it is, inside the codec's payload after P.
  const uint64_t own =
      dynamic_cast<SummableCodec&>(*group.codecs[0]).sum_grouped(MessageKind::Gradient);
  const uint64_t rest = group.payload[0].size() - own;
  ASSERT_EQ(rest, 1000u + kWhole);
  for (uint32_t r = 0; r < kRanks; ++r) {
    buffers[r] = group.place(grad(r, 0), grad(r, 0, kWhole));
    reqs[r] = group.rounds[r]->start(buffers[r], {group.kept, group.whole_runs}, 0);
    ASSERT_EQ(reqs[r].size(), 2u);
    EXPECT_EQ(reqs[r][0].format, WireFloat::I8);
    EXPECT_EQ(reqs[r][0].columns, 3u);
    EXPECT_EQ(reqs[r][0].offset, 0u);
    EXPECT_EQ(reqs[r][0].count, own);
    EXPECT_EQ(reqs[r][1].room, 0);
    EXPECT_EQ(reqs[r][1].format, WireFloat::I8);
    EXPECT_EQ(reqs[r][1].columns, 1u);
    EXPECT_EQ(reqs[r][1].offset, own);
    EXPECT_EQ(reqs[r][1].count, rest);
  }
  auto got = group.run(reqs);
  for (uint32_t r = 0; r < kRanks; ++r) {
    reqs[r] = group.rounds[r]->next(Group::spans(got[r]));
    ASSERT_EQ(reqs[r].size(), 1u);
    EXPECT_EQ(reqs[r][0].room, 1);
    EXPECT_EQ(reqs[r][0].format, WireFloat::I8);
    EXPECT_EQ(reqs[r][0].columns, 3u);
  }
  got = group.run(reqs);
  for (uint32_t r = 0; r < kRanks; ++r)
    EXPECT_NO_THROW(
        group.rounds[r]->finish(Group::spans(got[r]), buffers[r], {group.kept, group.whole_runs}));
}

// PowerSGD's query is a float vector, so the checks of its sums wait for finish() (one host read
// a step on a GPU instead of one per check): after a NaN on one rank every rank, that one too,
// runs the second phase and raises at finish(), the healthy ones naming another rank; the next
// step agrees.
TEST(Round, ATwoPhaseCodecWithAFloatQueryRaisesAtFinishOnEveryRank) {
  for (const char* spec :
       {"powersgd:rank=2,layout=50x80+1000", "powersgd:rank=2,wire=fp16,layout=50x80+1000"}) {
    SCOPED_TRACE(spec);
    Group group(spec, kWhole);
    std::vector<std::vector<float>> x(kRanks), whole(kRanks), buffers(kRanks);
    std::vector<std::vector<Round::Request>> reqs(kRanks);
    for (uint32_t r = 0; r < kRanks; ++r) {
      x[r] = grad(r, 0);
      whole[r] = grad(r, 0, kWhole);
    }
    x[1][4321] = std::numeric_limits<float>::infinity();
    for (uint32_t r = 0; r < kRanks; ++r) {
      buffers[r] = group.place(x[r], whole[r]);
      reqs[r] = group.rounds[r]->start(buffers[r], {group.kept, group.whole_runs}, 0);
    }
    auto got = group.run(reqs);
    for (uint32_t r = 0; r < kRanks; ++r)
      ASSERT_NO_THROW(reqs[r] = group.rounds[r]->next(Group::spans(got[r]))) << "rank " << r;
    got = group.run(reqs);
    for (uint32_t r = 0; r < kRanks; ++r) {
      try {
        group.rounds[r]->finish(Group::spans(got[r]), buffers[r], {group.kept, group.whole_runs});
        ADD_FAILURE() << "rank " << r << " finished a step with a rank's Inf in it";
      } catch (const NonFiniteError& e) {
        EXPECT_NE(std::string(e.what()).find(r == 1 ? "4321" : "another rank"), std::string::npos)
            << e.what();
      }
    }
    x[1][4321] = 0.0f;
    for (const auto& e : group.step(x, whole, 1)) ASSERT_EQ(e, "");
    for (uint32_t r = 1; r < kRanks; ++r) ASSERT_EQ(group.steps[r], group.steps[0]);
  }
}

// finish() of a part of the buffer (a rank's shard under FSDP) writes the values a whole
// finish() writes there, bit for bit, nothing outside it, and leaves the codec as a whole finish
// does: two groups in step, one finishing whole, one each rank a third of its buffer (the
// thirds cut runs and a matrix's rows anywhere), over rounds.
/// Rank r's part of a buffer of n values: [first, second).
using Part = std::pair<uint64_t, uint64_t> (*)(uint32_t r, uint64_t n);
std::pair<uint64_t, uint64_t> third(uint32_t r, uint64_t n) {
  return {r * n / kRanks, (r + 1) * n / kRanks};
}

void a_part_is_the_whole_finish_there(const std::string& spec, bool interleaved,
                                      Part part = third) {
  Group whole(spec, kWhole, interleaved), parts(spec, kWhole, interleaved);
  const uint64_t n = kDim + kWhole;
  for (uint64_t round = 0; round < 4; ++round) {
    std::vector<std::vector<float>> x(kRanks), w(kRanks), full(kRanks), mine(kRanks);
    std::vector<std::vector<Round::Request>> a(kRanks), b(kRanks);
    for (uint32_t r = 0; r < kRanks; ++r) {
      x[r] = grad(r, round);
      w[r] = grad(r, round, kWhole);
      full[r] = whole.place(x[r], w[r]);
      mine[r] = full[r];
      a[r] = whole.rounds[r]->start(full[r], {whole.kept, whole.whole_runs}, round);
      b[r] = parts.rounds[r]->start(mine[r], {parts.kept, parts.whole_runs}, round);
    }
    for (int phase = 1;; ++phase) {
      const auto got_a = whole.run(a), got_b = parts.run(b);
      const bool last = phase == whole.rounds[0]->phases();
      for (uint32_t r = 0; r < kRanks; ++r) {
        if (!last) {
          a[r] = whole.rounds[r]->next(Group::spans(got_a[r]));
          b[r] = parts.rounds[r]->next(Group::spans(got_b[r]));
          continue;
        }
        whole.rounds[r]->finish(Group::spans(got_a[r]), full[r], {whole.kept, whole.whole_runs});
        const auto [lo, hi] = part(r, n);
        std::vector<float> out(hi - lo + 2, -7.0f);  // a value either side: not to be written
        const auto before = mine[r];
        parts.rounds[r]->finish(Group::spans(got_b[r]), std::span(out).subspan(1, hi - lo), lo, n,
                                {parts.kept, parts.whole_runs});
        ASSERT_EQ(std::memcmp(out.data() + 1, full[r].data() + lo, (hi - lo) * 4), 0)
            << "round " << round << " rank " << r;
        EXPECT_EQ(out.front(), -7.0f);
        EXPECT_EQ(out.back(), -7.0f);
        EXPECT_EQ(mine[r], before) << "the buffer is read, not written";
      }
      if (last) break;
    }
    for (uint32_t r = 0; r < kRanks; ++r)
      ASSERT_EQ(whole.codecs[r]->save_state(), parts.codecs[r]->save_state())
          << "round " << round << " rank " << r;
  }
}

TEST_P(Rounds, FinishAPartWritesTheWholeFinishsValuesThere) {
  for (const bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "end to end");
    a_part_is_the_whole_finish_there(GetParam(), interleaved);
  }
}

// PowerSGD computes only a part's rows of its step, and its error feedback in full: at ranks up
// to 4 with the error's subtraction deferred (the CPU's fused pass), past 4 with it in the step's
// pass, its matrices in row blocks (FSDP's layout, blocks=2: a part of a third cuts blocks), and
// with a 16-bit wire.
TEST(Round, PowerSGDFinishesAPartAsItsWholeStep) {
  for (const char* spec : {"powersgd:rank=2,layout=50x80+1000", "powersgd:rank=6,layout=50x80+1000",
                           "powersgd:rank=3,blocks=2,layout=25x80+500+25x80+500",
                           "powersgd:rank=6,ef=0,blocks=2,layout=25x80+500+25x80+500",
                           "powersgd:rank=2,wire=fp16,layout=50x80+1000"}) {
    SCOPED_TRACE(spec);
    a_part_is_the_whole_finish_there(spec, false);
  }
  // Parts inside one row of the 50 × 80 matrix (43 of its values from the 8th of row 7·r), the
  // error in the step's pass (rank 6): that row's subtracted once.
  a_part_is_the_whole_finish_there(
      "powersgd:rank=6,layout=50x80+1000", false, [](uint32_t r, uint64_t) {
        return std::pair<uint64_t, uint64_t>{560 * r + 7, 560 * r + 50};
      });
}

TEST(Round, RefusesAPartPastTheBuffer) {
  Group group("powersgd:rank=2,layout=50x80+1000", kWhole);
  std::vector<std::vector<float>> x(kRanks), w(kRanks), buffers(kRanks);
  std::vector<std::vector<Round::Request>> reqs(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    buffers[r] = group.place(grad(r, 0), grad(r, 0, kWhole));
    reqs[r] = group.rounds[r]->start(buffers[r], {group.kept, group.whole_runs}, 0);
  }
  auto got = group.run(reqs);
  for (uint32_t r = 0; r < kRanks; ++r) reqs[r] = group.rounds[r]->next(Group::spans(got[r]));
  got = group.run(reqs);
  const uint64_t n = kDim + kWhole;
  std::vector<float> out(100);
  const Round::Runs at{group.kept, group.whole_runs};
  EXPECT_THROW(group.rounds[0]->finish(Group::spans(got[0]), out, n - 99, n, at), InvalidArgument);
  EXPECT_THROW(group.rounds[0]->finish(Group::spans(got[0]), out, n + 1, n, at), InvalidArgument);
  EXPECT_THROW(group.rounds[0]->finish(Group::spans(got[0]), out, 0, kDim, at), InvalidArgument);
  EXPECT_NO_THROW(group.rounds[0]->finish(Group::spans(got[0]), out, n - 100, n, at));
}

// A group in one process: rank 0's round reduces the messages once and every rank finishes from
// that update; the steps, the whole tensors' mean and every codec's state are those of each rank
// reducing on its own, bit for bit, step after step.
class GatheredRounds : public ::testing::TestWithParam<std::string> {};

TEST_P(GatheredRounds, AnUpdateReducedOnceFinishesEveryRankAsItsOwnWould) {
  Group own(GetParam(), kWhole, true), shared(GetParam(), kWhole, true);
  ASSERT_TRUE(own.rounds[0]->gathered());
  for (uint64_t round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> x(kRanks), whole(kRanks);
    for (uint32_t r = 0; r < kRanks; ++r) {
      x[r] = grad(r, round);
      whole[r] = grad(r, round, kWhole);
    }
    for (const auto& e : own.step(x, whole, round)) ASSERT_EQ(e, "");
    for (const auto& e : shared.step(x, whole, round, true)) ASSERT_EQ(e, "");
    for (uint32_t r = 0; r < kRanks; ++r) {
      ASSERT_EQ(shared.steps[r], own.steps[r]) << "round " << round << " rank " << r;
      ASSERT_EQ(shared.wholes[r], own.wholes[r]) << "round " << round << " rank " << r;
      ASSERT_EQ(shared.codecs[r]->save_state(), own.codecs[r]->save_state()) << "round " << round;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Rounds, ::testing::ValuesIn(fp32_examples()),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

/// The registry's examples of gathered codecs (nothing summed, every rank's message gathered).
std::vector<std::string> gathered_examples() {
  std::vector<std::string> out;
  for (const auto& spec : example_specs(Layout::parse("50x80+1000")))
    if (Group(spec, 0).rounds[0]->gathered()) out.push_back(spec);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Codecs, GatheredRounds, ::testing::ValuesIn(gathered_examples()),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

// reduce=sparse: the update is the sparse all-reduce's of the ranks' lists (each its top-k):
// the union's mean at its largest buckets, at most k values; what a rank's list lost goes back
// to its error feedback, so the next lists are the top-k of what is left (a step of zero
// gradients at the end sends only that).
TEST(SparseRound, KeepsTheLargestAndErrorFeedbackTakesBackTheRest) {
  const uint64_t k = 50;
  Group group("topk:k=50,reduce=sparse", kWhole, true);
  ASSERT_TRUE(group.rounds[0]->sparse());
  ASSERT_FALSE(group.rounds[0]->gathered());
  ASSERT_EQ(group.rounds[0]->phases(), 6);
  std::vector<std::vector<float>> residual(kRanks, std::vector<float>(kDim, 0.0f));
  for (uint64_t round = 0; round < 4; ++round) {
    std::vector<std::vector<float>> x(kRanks), whole(kRanks);
    std::vector<sparse::Sparse> lists(kRanks);
    SparseSum sum;
    for (uint32_t r = 0; r < kRanks; ++r) {
      x[r] = round == 3 ? std::vector<float>(kDim, 0.0f) : grad(r, round);
      whole[r] = grad(r, round, kWhole);
      for (uint64_t j = 0; j < kDim; ++j) residual[r][j] += x[r][j];
      lists[r].indices.resize(k);
      lists[r].values.resize(k);
      kernels::cpu::topk(residual[r].data(), kDim, k, lists[r].indices.data(),
                         lists[r].values.data(), kernels::Order::Index);
      sum.add(lists[r].indices, lists[r].values);
    }
    const sparse::Sparse all = sum.mean(kRanks);
    std::vector<float> counts(sparse::kBuckets, 0.0f), fine(sparse::kBuckets, 0.0f);
    sparse::count(all, counts);
    const uint32_t split = sparse::split(counts, k);
    sparse::count_fine(all, split, fine);
    const sparse::Sparse update = sparse::keep(all, sparse::cut(counts, fine, split, k));
    ASSERT_LE(update.indices.size(), k);
    ASSERT_LT(update.indices.size(), all.indices.size())
        << "round " << round << ": nothing dropped";
    std::vector<float> want(kDim, 0.0f);
    for (size_t i = 0; i < update.indices.size(); ++i) want[update.indices[i]] = update.values[i];

    for (const auto& e : group.step(x, whole, round)) ASSERT_EQ(e, "") << "round " << round;
    for (uint32_t r = 0; r < kRanks; ++r)
      ASSERT_EQ(std::memcmp(group.steps[r].data(), want.data(), kDim * sizeof(float)), 0)
          << "round " << round << " rank " << r;
    for (uint32_t r = 0; r < kRanks; ++r)
      for (uint32_t i : lists[r].indices)  // sent and kept leaves the residual; dropped stays
        if (std::binary_search(update.indices.begin(), update.indices.end(), i))
          residual[r][i] = 0.0f;
  }
}

// A part that does not decode (corrupted between ranks) stops every rank in the same phase:
// its owner with the reason, the others told through the counts' sum; the next step goes on.
TEST(SparseRound, ACorruptPartStopsEveryRankAlike) {
  Group group("topk:k=50,reduce=sparse", kWhole);
  const Round::Runs at{group.kept, group.whole_runs};
  std::vector<std::vector<float>> buffers(kRanks);
  std::vector<std::vector<Round::Request>> reqs(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    buffers[r] = group.place(grad(r, 0), grad(r, 0, kWhole));
    reqs[r] = group.rounds[r]->start(buffers[r], at, 0);
  }
  std::vector<std::string> errors(kRanks);
  for (int phase = 1; phase < 5; ++phase) {
    auto got = group.run(reqs);
    if (phase == 2) got[1][2][0] ^= 0x7F;  // rank 2's part for rank 1: its count garbled
    for (uint32_t r = 0; r < kRanks; ++r) try {
        reqs[r] = group.rounds[r]->next(Group::spans(got[r]));
      } catch (const WireError& e) {
        errors[r] = e.what();
      }
    if (phase == 3) break;  // after the counts' sum: everyone knows
  }
  EXPECT_NE(errors[1].find("part"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("another rank"), std::string::npos) << errors[0];
  EXPECT_NE(errors[2].find("another rank"), std::string::npos) << errors[2];
  std::vector<std::vector<float>> x(kRanks), whole(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    x[r] = grad(r, 1);
    whole[r] = grad(r, 1, kWhole);
  }
  for (const auto& e : group.step(x, whole, 1)) ASSERT_EQ(e, "");
  for (uint32_t r = 1; r < kRanks; ++r) ASSERT_EQ(group.steps[r], group.steps[0]);
}

// Half-precision wires: the ranks agree with each other (the collective's rounding is the same
// for all), and the whole tensors still travel beside the payload.
TEST(Round, EveryExampleRunsAndTheRanksAgree) {
  for (const auto& spec : example_specs(Layout::parse("50x80+1000"))) {
    Group group(spec, kWhole);
    for (uint64_t round = 0; round < 2; ++round) {
      std::vector<std::vector<float>> x(kRanks), whole(kRanks);
      for (uint32_t r = 0; r < kRanks; ++r) {
        x[r] = grad(r, round);
        whole[r] = grad(r, round, kWhole);
      }
      for (const auto& e : group.step(x, whole, round)) ASSERT_EQ(e, "") << spec;
      for (uint32_t r = 1; r < kRanks; ++r) {
        ASSERT_EQ(group.steps[r], group.steps[0]) << spec;
        ASSERT_EQ(group.wholes[r], group.wholes[0]) << spec;
      }
    }
  }
}

TEST(Round, AUnitOfWholeTensorsOnlyIsTheirMean) {
  std::vector<std::vector<float>> payload(kRanks, std::vector<float>(kWhole));
  std::vector<float> sum(kWhole, 0.0f);
  const std::vector<Layout::Run> whole{{0, 30}, {35, kWhole - 30}}, none;
  std::vector<std::vector<float>> buffers;
  std::vector<std::unique_ptr<Round>> rounds;
  for (uint32_t r = 0; r < kRanks; ++r)
    rounds.push_back(std::make_unique<Round>(kRanks, kWhole, Device::cpu(), payload[r]));
  for (uint32_t r = 0; r < kRanks; ++r) {
    buffers.push_back(grad(r, 0, kWhole + 5));
    const auto reqs = rounds[r]->start(buffers[r], {none, whole}, 0);
    ASSERT_EQ(reqs.size(), 1u);
    EXPECT_EQ(reqs[0].op, Round::Op::Sum);
    for (uint64_t j = 0; j < kWhole; ++j) sum[j] += buffers[r][j < 30 ? j : j + 5];
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    payload[r] = sum;
    const auto before = buffers[r];
    rounds[r]->finish({}, buffers[r], {none, whole});
    for (uint64_t j = 0; j < kWhole; ++j)
      ASSERT_EQ(buffers[r][j < 30 ? j : j + 5], sum[j] * (1.0f / kRanks));
    for (uint64_t j = 30; j < 35; ++j) ASSERT_EQ(buffers[r][j], before[j]);  // between the runs
  }
  // A NaN in rank 2's tensors: every rank raises at finish(), rank 2 naming where (the buffer's
  // coordinate 40: the whole values' 35th, past the gap), and no buffer changes.
  buffers[2][40] = std::numeric_limits<float>::quiet_NaN();
  std::fill(sum.begin(), sum.end(), 0.0f);
  for (uint32_t r = 0; r < kRanks; ++r) {
    rounds[r]->start(buffers[r], {none, whole}, 1);
    for (uint64_t j = 0; j < kWhole; ++j) sum[j] += payload[r][j];
  }
  for (uint32_t r = 0; r < kRanks; ++r) {
    payload[r] = sum;
    const auto before = buffers[r];
    try {
      rounds[r]->finish({}, buffers[r], {none, whole});
      ADD_FAILURE() << "rank " << r << " did not raise";
    } catch (const NonFiniteError& e) {
      EXPECT_NE(std::string(e.what()).find(r == 2 ? "coordinate 40" : "another rank"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(std::memcmp(buffers[r].data(), before.data(), before.size() * 4), 0) << "rank " << r;
  }
}

// reduce() and finish_update(): only a gathered round's, only after its last phase, and an update
// that is not this codec's refused with nothing changed (the same step then finishes).
TEST(Round, ReducingOnceRefusesCallsOutOfOrderAndForeignUpdates) {
  Group summed("sketch:rows=1,cols=500,k=50", kWhole);
  EXPECT_FALSE(summed.rounds[0]->gathered());
  EXPECT_THROW(summed.rounds[0]->reduce({}), ProtocolError);
  std::vector<float> buf(kDim + kWhole);
  const Round::Runs at{summed.kept, summed.whole_runs};
  const std::vector<uint8_t> some(64, 1);
  EXPECT_THROW(summed.rounds[0]->finish_update(some, buf, at), ProtocolError);

  Group group("topk:k=50", kWhole);
  ASSERT_TRUE(group.rounds[0]->gathered());
  std::vector<std::vector<float>> buffers(kRanks);
  std::vector<std::vector<Round::Request>> reqs(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    buffers[r] = group.place(grad(r, 0), grad(r, 0, kWhole));
    reqs[r] = group.rounds[r]->start(buffers[r], at, 0);
  }
  auto got = group.run(reqs);
  EXPECT_THROW(group.rounds[0]->reduce(Group::spans(got[0])), ProtocolError);  // a phase is left
  for (uint32_t r = 0; r < kRanks; ++r) reqs[r] = group.rounds[r]->next(Group::spans(got[r]));
  got = group.run(reqs);
  const auto all = Group::spans(got[0]);
  EXPECT_THROW(group.rounds[0]->reduce(std::span(all).first(1)), InvalidArgument);
  const Message update = group.rounds[0]->reduce(all);
  // Truncated, empty or garbled bytes.
  const auto bytes = update.bytes();
  std::vector<uint8_t> garbled(bytes.begin(), bytes.end());
  garbled[0] ^= 0xFF;
  EXPECT_THROW(group.rounds[1]->finish_update(bytes.first(bytes.size() - 3), buffers[1], at),
               WireError);
  EXPECT_THROW(group.rounds[1]->finish_update({}, buffers[1], at), WireError);
  EXPECT_THROW(group.rounds[1]->finish_update(garbled, buffers[1], at), WireError);
  // Refused before anything changed: the step finishes from the update, as rank 2's own.
  group.rounds[1]->finish_update(bytes, buffers[1], at);
  group.rounds[2]->finish(all, buffers[2], at);
  std::vector<float> x1(kDim), w1(kWhole), x2(kDim), w2(kWhole);
  group.take(buffers[1], x1, w1);
  group.take(buffers[2], x2, w2);
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(w1, w2);
}

TEST(Round, RefusesWrongSizesAndCallsOutOfOrder) {
  auto codec = make_compressor("topk:k=50", kDim);
  auto agg = codec->make_aggregator(kRanks);
  std::vector<float> payload(kWhole), small(kWhole - 1), none;
  EXPECT_THROW(Round(*codec, *agg, kRanks, kWhole, {payload, none}), InvalidArgument);  // rank
  EXPECT_THROW(Round(*codec, *agg, 0, kWhole, {small, none}), InvalidArgument);
  EXPECT_THROW(Round(0, kWhole, Device::cpu(), payload), InvalidArgument);
  // The round goes by the codec's family: a summable codec with a gathered codec's aggregator
  // (or the reverse) has no exchange to run.
  auto dense = make_compressor("dense", kDim);
  auto dense_agg = dense->make_aggregator(kRanks);
  std::vector<float> dense_payload(Round::payload_size(dense.get(), kWhole));
  EXPECT_THROW(Round(*dense, *agg, 0, kWhole, {dense_payload, none}), InvalidArgument);
  EXPECT_THROW(Round(*codec, *dense_agg, 0, kWhole, {payload, none}), InvalidArgument);
  Round round(*codec, *agg, 0, kWhole, {payload, none});
  EXPECT_EQ(round.phases(), 2);
  auto buffer = grad(0, 0, kDim + kWhole);
  const std::vector<Layout::Run> kept{{0, kDim}}, whole{{kDim, kWhole}};
  const std::vector<Layout::Run> short_kept{{0, kDim - 1}}, past{{kDim + 1, kWhole}};
  EXPECT_THROW(round.start(buffer, {short_kept, whole}, 0), InvalidArgument);
  EXPECT_THROW(round.start(buffer, {kept, past}, 0), InvalidArgument);
  EXPECT_THROW(round.start(std::span(buffer).first(kDim), {kept, whole}, 0), InvalidArgument);
  const auto reqs = round.start(buffer, {kept, whole}, 0);
  EXPECT_THROW(round.finish({}, buffer, {kept, whole}), ProtocolError);  // a phase is left
  // Lengths that are not 8 bytes, too long, or from too few ranks.
  const std::vector<uint8_t> three(3), eight(8, 0xFF);
  const std::vector<std::span<const uint8_t>> short_ones(kRanks, three), too_long(kRanks, eight);
  EXPECT_THROW(round.next(std::vector<std::span<const uint8_t>>(1, reqs[0].bytes)),
               InvalidArgument);
  EXPECT_THROW(round.next(short_ones), WireError);
  EXPECT_THROW(round.next(too_long), WireError);
}

}  // namespace
}  // namespace sketchsgd
