// Scatter: a gathered codec's reduce-scatter per destination, driven here by an in-process group
// (an all-gather of the lengths, an all-to-all of the messages, the whole tensors summed), against
// each chunk's plain round among the same ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/scatter.hpp>
#include <sketchsgd/core/error.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

constexpr uint32_t kRanks = 3;
constexpr uint64_t kDim = 5000;

/// A chunk's unit: its codec (none: tensors sent whole only), compressed values and whole ones.
struct Chunk {
  std::string spec;
  uint64_t dim, whole;
  std::vector<Layout::Run> kept() const {
    return dim ? std::vector<Layout::Run>{{0, dim}} : std::vector<Layout::Run>{};
  }
  std::vector<Layout::Run> whole_runs() const { return {{dim, whole}}; }
  Round::Runs runs(std::vector<Layout::Run>& k, std::vector<Layout::Run>& w) const {
    k = kept();
    w = whole_runs();
    return {k, w};
  }
};

/// One rank's rounds, one per chunk.
struct Rank {
  std::vector<std::unique_ptr<Compressor>> codecs;
  std::vector<std::unique_ptr<Aggregator>> aggregators;
  std::vector<std::vector<float>> payload, answer;
  std::vector<std::unique_ptr<Round>> rounds;

  Rank(const std::vector<Chunk>& chunks, uint32_t rank)
      : codecs(chunks.size()),
        aggregators(chunks.size()),
        payload(chunks.size()),
        answer(chunks.size()) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (chunks[c].spec.empty()) {
        payload[c].resize(chunks[c].whole);
        rounds.push_back(
            std::make_unique<Round>(kRanks, chunks[c].whole, Device::cpu(), payload[c]));
        continue;
      }
      codecs[c] = make_compressor(chunks[c].spec, chunks[c].dim);
      aggregators[c] = codecs[c]->make_aggregator(kRanks);
      payload[c].resize(Round::payload_size(codecs[c].get(), chunks[c].whole, true));
      answer[c].resize(Round::answer_size(codecs[c].get()));
      rounds.push_back(std::make_unique<Round>(*codecs[c], *aggregators[c], rank, chunks[c].whole,
                                               Round::Rooms{payload[c], answer[c]}, true));
    }
  }
};

/// kRanks ranks' chunks; step() runs one step through Scatter, plain() each chunk's own round.
struct Group {
  std::vector<Chunk> chunks;
  std::vector<Rank> ranks;

  explicit Group(std::vector<Chunk> c) : chunks(std::move(c)) {
    for (uint32_t r = 0; r < kRanks; ++r) ranks.emplace_back(chunks, r);
  }

  /// Every rank's buffer of every chunk for a step: its compressed values, then its whole ones.
  std::vector<std::vector<std::vector<float>>> buffers(uint64_t round) const {
    std::vector<std::vector<std::vector<float>>> out(kRanks);
    for (uint32_t i = 0; i < kRanks; ++i)
      for (size_t c = 0; c < chunks.size(); ++c) {
        out[i].push_back(
            test::gaussian(chunks[c].dim + chunks[c].whole, 1000 * round + 10 * i + c));
        for (uint64_t j = 0; j < 30 && chunks[c].dim; ++j)  // heavy hitters
          out[i][c][(j * 97 + round) % chunks[c].dim] += 8.0f * (j % 2 ? -1.0f : 1.0f);
      }
    return out;
  }

  /// Every chunk's whole values summed over the ranks, into rank c's room of chunk c: what the
  /// driver's reduce-scatter does.
  void sum_whole() {
    for (size_t c = 0; c < chunks.size(); ++c) {
      std::vector<float> sum(ranks[0].payload[c].size(), 0.0f);
      for (auto& rank : ranks)
        for (size_t j = 0; j < sum.size(); ++j) sum[j] += rank.payload[c][j];
      ranks[c].payload[c] = sum;
    }
  }

  /// One step through Scatter: rank c's mean of chunk c into out[c]; every rank's error ("" for
  /// none). table_edit, if set, changes the gathered table before next() (a corrupt length).
  std::vector<std::string> step(std::vector<std::vector<std::vector<float>>> bufs, uint64_t round,
                                std::vector<std::vector<float>>& out,
                                void (*table_edit)(std::vector<uint64_t>&) = nullptr) {
    std::vector<std::string> errors(kRanks);
    std::vector<Scatter> scatters;
    std::vector<uint64_t> table;
    std::vector<Layout::Run> k, w;
    for (uint32_t i = 0; i < kRanks; ++i) {
      std::vector<Round*> rounds;
      for (size_t c = 0; c < chunks.size(); ++c) {
        ranks[i].rounds[c]->start(bufs[i][c], chunks[c].runs(k, w), round);
        rounds.push_back(ranks[i].rounds[c].get());
      }
      scatters.emplace_back(rounds, i);
      for (uint64_t n : scatters[i].lengths()) table.push_back(n);
    }
    if (table_edit) table_edit(table);
    std::vector<Scatter::Exchange> ex(kRanks);
    for (uint32_t i = 0; i < kRanks; ++i) {
      try {
        ex[i] = scatters[i].next(table);
      } catch (const Error& e) {
        errors[i] = e.what();
      }
    }
    for (const auto& e : errors)
      if (!e.empty()) return errors;  // every rank stopped before the all-to-all, or none
    sum_whole();
    out.assign(kRanks, {});
    for (uint32_t me = 0; me < kRanks; ++me) {
      std::vector<std::span<const uint8_t>> received;
      for (uint32_t i = 0; i < kRanks; ++i) {
        EXPECT_EQ(ex[i].send[me].size(), ex[me].receive[i]) << i << " -> " << me;
        received.push_back(ex[i].send[me]);
      }
      try {
        ranks[me].rounds[me]->finish(received, bufs[me][me], chunks[me].runs(k, w));
      } catch (const Error& e) {
        errors[me] = e.what();
      }
      out[me] = bufs[me][me];
    }
    return errors;
  }

  /// Each chunk c's plain round among the ranks (an all-gather of lengths, then of padded
  /// messages, whole tensors summed): rank c's mean of chunk c into out[c]; every rank's errors
  /// (a rank's last).
  std::vector<std::string> plain(std::vector<std::vector<std::vector<float>>> bufs, uint64_t round,
                                 std::vector<std::vector<float>>& out) {
    std::vector<std::string> errors(kRanks);
    out.assign(kRanks, {});
    std::vector<Layout::Run> k, w;
    for (size_t c = 0; c < chunks.size(); ++c) {
      std::vector<std::vector<uint8_t>> got;
      for (uint32_t i = 0; i < kRanks; ++i) {
        const auto reqs = ranks[i].rounds[c]->start(bufs[i][c], chunks[c].runs(k, w), round);
        if (ranks[i].rounds[c]->compresses())
          got.emplace_back(reqs[0].bytes.begin(), reqs[0].bytes.end());
      }
      if (!got.empty()) {
        const std::vector<std::span<const uint8_t>> lengths(got.begin(), got.end());
        std::vector<std::vector<uint8_t>> padded;
        for (uint32_t i = 0; i < kRanks; ++i) {
          try {
            const auto reqs = ranks[i].rounds[c]->next(lengths);
            padded.emplace_back(reqs[0].bytes.begin(), reqs[0].bytes.end());
          } catch (const Error& e) {
            errors[i] = e.what();
          }
        }
        if (padded.size() < kRanks) continue;  // chunk c's step failed; the next chunk's goes on
        got = padded;
      }
      std::vector<float> sum(ranks[0].payload[c].size(), 0.0f);
      for (auto& rank : ranks)
        for (size_t j = 0; j < sum.size(); ++j) sum[j] += rank.payload[c][j];
      const std::vector<std::span<const uint8_t>> gathered(got.begin(), got.end());
      for (uint32_t i = 0; i < kRanks; ++i) {
        ranks[i].payload[c] = sum;
        try {
          ranks[i].rounds[c]->finish(gathered, bufs[i][c], chunks[c].runs(k, w));
        } catch (const Error& e) {
          errors[i] = e.what();
        }
      }
      out[c] = bufs[c][c];
    }
    return errors;
  }
};

std::vector<std::string> gathered_examples() {
  std::vector<std::string> out;
  for (const auto& spec : example_specs(Layout::parse("50x80+1000")))
    if (make_compressor(spec, kDim)->sum_size(MessageKind::Gradient) == 0) out.push_back(spec);
  return out;
}

class Scatters : public ::testing::TestWithParam<std::string> {};

/// The chunks of a test: two coded ones of the same shape (FSDP2's), one of whole tensors alone
/// (an FSDP1 chunk that cuts no compressed tensor whole).
std::vector<Chunk> chunks_of(const std::string& spec) {
  return {{spec, kDim, 40}, {spec, kDim, 40}, {"", 0, 25}};
}

// What each rank keeps is what its chunk's own round among the ranks gives it, bit for bit, and
// every rank's codec state (its error feedback) is the same, step after step — a failed step
// (rank 1's chunk 0 not finite) among them: every rank raises before anything is exchanged, rank
// 1 naming the coordinate, and the next step goes on.
TEST_P(Scatters, EachRankKeepsItsChunksPlainRoundBitForBit) {
  Group scattered(chunks_of(GetParam())), plain(chunks_of(GetParam()));
  for (uint64_t round = 0; round < 4; ++round) {
    auto bufs = scattered.buffers(round);
    if (round == 2) bufs[1][0][123] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::vector<float>> got, want;
    const auto errors = scattered.step(bufs, round, got);
    const auto plain_errors = plain.plain(bufs, round, want);
    for (uint32_t i = 0; i < kRanks; ++i) {
      if (round != 2) {
        ASSERT_EQ(errors[i], "") << "round " << round << " rank " << i;
        ASSERT_EQ(plain_errors[i], "");
        ASSERT_EQ(got[i], want[i]) << "round " << round << " rank " << i;
      } else {
        EXPECT_NE(errors[i].find(i == 1 ? "coordinate 123" : "rank 1's gradient was not finite"),
                  std::string::npos)
            << errors[i];
      }
      for (size_t c = 0; c < 2; ++c)
        ASSERT_EQ(scattered.ranks[i].codecs[c]->save_state(),
                  plain.ranks[i].codecs[c]->save_state())
            << "round " << round << " rank " << i << " chunk " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Scatters, ::testing::ValuesIn(gathered_examples()),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

// A tensor sent whole that is not finite is a failure of that rank's step like a compressed one.
TEST(Scatter, ANonFiniteWholeTensorStopsEveryRankBeforeTheExchange) {
  Group group(chunks_of("topk:k=100"));
  auto bufs = group.buffers(0);
  bufs[2][2][7] = std::numeric_limits<float>::infinity();  // chunk 2: whole tensors alone
  std::vector<std::vector<float>> out;
  const auto errors = group.step(bufs, 0, out);
  EXPECT_NE(errors[2].find("coordinate 7"), std::string::npos) << errors[2];
  for (uint32_t i : {0u, 1u})
    EXPECT_NE(errors[i].find("rank 2's gradient was not finite"), std::string::npos) << errors[i];
}

// A corrupt table (a length over the chunk's message limit, a chunk of whole tensors alone said
// to send more than its marker) is a WireError on every rank, before any message moves.
TEST(Scatter, ALengthOverItsChunksLimitIsAWireErrorOnEveryRank) {
  for (auto edit : {+[](std::vector<uint64_t>& t) { t[1 * kRanks + 0] = uint64_t(1) << 40; },
                    +[](std::vector<uint64_t>& t) { t[0 * kRanks + 2] = 2; }}) {
    Group group(chunks_of("signsgd"));
    std::vector<std::vector<float>> out;
    const auto errors = group.step(group.buffers(0), 0, out, edit);
    for (uint32_t i = 0; i < kRanks; ++i)
      EXPECT_TRUE(
          errors[i].find("rank 1 sent a message of 1099511627776 bytes for rank 0's chunk") !=
              std::string::npos ||
          errors[i].find("rank 0 sent a message of 2 bytes for rank 2's chunk (limit 1)") !=
              std::string::npos)
          << errors[i];
  }
}

TEST(Scatter, RefusesRoundsItCannotScatterAndAWrongTable) {
  Group group(chunks_of("topk:k=100"));
  std::vector<Round*> rounds;
  for (auto& r : group.ranks[0].rounds) rounds.push_back(r.get());
  EXPECT_THROW(Scatter({}, 0), InvalidArgument);
  EXPECT_THROW(Scatter(rounds, kRanks), InvalidArgument);
  EXPECT_THROW(Scatter({rounds[0], rounds[1]}, 0), InvalidArgument);  // rounds of 3 ranks
  EXPECT_THROW(Scatter({rounds[0], nullptr, rounds[2]}, 0), InvalidArgument);
  // A summable codec's round goes whole.
  Group summed({{"dense", kDim, 0}, {"dense", kDim, 0}, {"dense", kDim, 0}});
  std::vector<Round*> sums;
  for (auto& r : summed.ranks[0].rounds) sums.push_back(r.get());
  EXPECT_THROW(Scatter(sums, 0), InvalidArgument);

  Scatter scatter(rounds, 0);
  EXPECT_EQ(scatter.world(), kRanks);
  const std::vector<uint64_t> short_table(kRanks * kRanks - 1, 1);
  EXPECT_THROW(scatter.next(short_table), InvalidArgument);
}

}  // namespace
}  // namespace sketchsgd
