// Codecs used through collectives (a DDP hook): summed payloads in place of W messages, and the
// worker state saved and restored.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

constexpr uint32_t kWorkers = 3;
constexpr uint64_t kDim = 5000;

struct Job {
  std::vector<std::unique_ptr<Compressor>> workers;
  std::unique_ptr<Aggregator> server;
  explicit Job(const std::string& spec) {
    for (uint32_t w = 0; w < kWorkers; ++w) workers.push_back(make_compressor(spec, kDim));
    server = workers[0]->make_aggregator(kWorkers);
  }
};

std::vector<float> grad(uint32_t worker, uint64_t round) {
  auto g = test::gaussian(kDim, 1000 * round + worker);
  for (uint32_t j = 0; j < 40; ++j) g[(j * 97 + round) % kDim] += 8.0f * (j % 2 ? -1.0f : 1.0f);
  return g;
}

/// One round through messages (what the parameter server sees); returns the update.
Bytes round_by_messages(Job& job, uint64_t round) {
  for (uint32_t w = 0; w < kWorkers; ++w)
    job.server->add(job.workers[w]->encode(grad(w, round), round, w).bytes());
  Message m = job.server->finish();
  if (job.server->expecting() == MessageKind::Answer) {
    for (uint32_t w = 0; w < kWorkers; ++w)
      job.server->add(job.workers[w]->answer(m.bytes(), w).bytes());
    m = job.server->finish();
  }
  return Bytes(m.bytes().begin(), m.bytes().end());
}

/// The workers' encode_sum() payloads of a round added up, as an all-reduce delivers them
/// (summed in worker order), handed to the server.
void add_gradient_sum(Job& job, uint64_t round) {
  std::vector<float> sum(job.workers[0]->sum_size(MessageKind::Gradient)), part(sum.size());
  for (uint32_t w = 0; w < kWorkers; ++w) {
    job.workers[w]->encode_sum(grad(w, round), round, part);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  job.server->add_sum(sum, kWorkers, round);
}

/// The same round through sums.
Bytes round_by_sums(Job& job, uint64_t round) {
  auto& first = *job.workers[0];
  add_gradient_sum(job, round);
  Message m = job.server->finish();
  if (job.server->expecting() == MessageKind::Answer) {
    std::vector<float> ans(first.sum_size(MessageKind::Answer), 0.0f), mine(ans.size());
    for (uint32_t w = 0; w < kWorkers; ++w) {
      job.workers[w]->answer_sum(m.bytes(), mine);
      for (size_t i = 0; i < ans.size(); ++i) ans[i] += mine[i];
    }
    job.server->add_sum(ans, kWorkers, round);
    m = job.server->finish();
  }
  return Bytes(m.bytes().begin(), m.bytes().end());
}

void apply_all(Job& job, const Bytes& update, std::vector<float>& step) {
  for (auto& w : job.workers) w->apply(update, step);
}

/// The registry's examples (a layout of kDim values for those that take one) of one family.
/// fp32_only: those whose sums travel in fp32; a 16-bit wire is summed in its own format by the
/// collective, which matches the messages' fp32 sum only to rounding (tests/python/test_hook.py).
std::vector<std::string> examples(bool summable, bool fp32_only = false) {
  // Beside the examples: PowerSGD without error feedback, which trains too poorly to be one.
  std::vector<std::string> out;
  if (summable) out.push_back("powersgd:rank=2,ef=0,warm=0,layout=50x80+1000");
  for (const auto& spec : example_specs(Layout::parse("50x80+1000"))) {
    const auto c = make_compressor(spec, kDim);
    if ((c->sum_size(MessageKind::Gradient) > 0) != summable) continue;
    if (fp32_only && c->sum_format(MessageKind::Gradient) != WireFloat::F32) continue;
    out.push_back(spec);
  }
  return out;
}

class Summable : public ::testing::TestWithParam<std::string> {};

TEST_P(Summable, SumsGiveTheUpdatesOfMessagesBitForBit) {
  Job by_msg(GetParam()), by_sum(GetParam());
  ASSERT_GT(by_sum.workers[0]->sum_size(MessageKind::Gradient), 0u);
  std::vector<float> a(kDim), b(kDim);
  for (uint64_t round = 0; round < 4; ++round) {
    const Bytes ua = round_by_messages(by_msg, round);
    const Bytes ub = round_by_sums(by_sum, round);
    ASSERT_EQ(ua, ub) << "round " << round;
    apply_all(by_msg, ua, a);
    apply_all(by_sum, ub, b);
    ASSERT_EQ(a, b);
  }
  // Worker and server state evolved identically.
  for (uint32_t w = 0; w < kWorkers; ++w)
    EXPECT_EQ(by_msg.workers[w]->save_state(), by_sum.workers[w]->save_state());
  EXPECT_EQ(by_msg.server->save_state(), by_sum.server->save_state());
}

INSTANTIATE_TEST_SUITE_P(Codecs, Summable, ::testing::ValuesIn(examples(true, true)),
                         test::spec_name<::testing::TestParamInfo<std::string>>);

/// The same round with the replies kept as values (Aggregator::finish_values, answer_values,
/// apply_values), as a hook keeps them on the device; every worker's step into steps[w].
void round_by_values(Job& job, uint64_t round, std::vector<std::vector<float>>& steps) {
  auto& first = *job.workers[0];
  add_gradient_sum(job, round);
  if (job.server->replying() == MessageKind::Query) {
    std::vector<float> query(first.reply_size(MessageKind::Query));
    job.server->finish_values(query);
    std::vector<float> ans(first.sum_size(MessageKind::Answer), 0.0f), mine(ans.size());
    for (uint32_t w = 0; w < kWorkers; ++w) {
      job.workers[w]->answer_values(query, mine);
      for (size_t i = 0; i < ans.size(); ++i) ans[i] += mine[i];
    }
    job.server->add_sum(ans, kWorkers, round);
  }
  std::vector<float> update(first.reply_size(MessageKind::Update));
  job.server->finish_values(update);
  for (uint32_t w = 0; w < kWorkers; ++w) job.workers[w]->apply_values(update, steps[w]);
}

/// Codecs whose Query and Update are float vectors: their values give what their messages give,
/// bit for bit (steps and every state), rounded to the wire format where it is 16-bit.
TEST(FloatReplies, ValuesGiveTheStepsOfMessagesBitForBit) {
  for (const char* spec :
       {"dense", "dense:momentum=0.9", "dense:wire=fp16", "dense:wire=bf16",
        "powersgd:rank=3,layout=50x80+1000", "powersgd:rank=2,ef=0,warm=0,layout=50x80+1000",
        "powersgd:rank=3,wire=fp16,layout=50x80+1000",
        "powersgd:rank=5,wire=bf16,momentum=0.9,layout=50x80+1000"}) {
    SCOPED_TRACE(spec);
    Job by_msg(spec), by_val(spec);
    ASSERT_GT(by_val.workers[0]->reply_size(MessageKind::Update), 0u);
    std::vector<float> a(kDim);
    std::vector<std::vector<float>> b(kWorkers, std::vector<float>(kDim));
    for (uint64_t round = 0; round < 4; ++round) {
      const Bytes u = round_by_sums(by_msg, round);
      round_by_values(by_val, round, b);
      for (uint32_t w = 0; w < kWorkers; ++w) {
        by_msg.workers[w]->apply(u, a);
        EXPECT_EQ(std::memcmp(b[w].data(), a.data(), kDim * sizeof(float)), 0)
            << "round " << round << " worker " << w;
      }
    }
    for (uint32_t w = 0; w < kWorkers; ++w)
      EXPECT_EQ(by_msg.workers[w]->save_state(), by_val.workers[w]->save_state());
  }
}

TEST(FloatReplies, WrongValuesAreRefusedAndChangeNothing) {
  Job job("powersgd:rank=3,layout=50x80+1000");
  auto& c = *job.workers[0];
  const uint64_t nq = c.reply_size(MessageKind::Query), nu = c.reply_size(MessageKind::Update);
  EXPECT_EQ(nq, 3u * 50);
  EXPECT_EQ(nu, 3u * (50 + 80) + 1000);
  std::vector<float> out(c.sum_size(MessageKind::Answer)), step(kDim);
  std::vector<float> query(nq, 0.1f), update(nu, 0.01f);
  // Nothing to finish yet; then outputs of the wrong length.
  EXPECT_THROW(job.server->finish_values(query), ProtocolError);
  std::vector<float> sum(c.sum_size(MessageKind::Gradient), 1.0f);
  job.server->add_sum(sum, kWorkers, 0);
  std::vector<float> longer(nu + 1), shorter(kDim - 1);
  EXPECT_THROW(job.server->finish_values(std::span<float>(longer).first(nq + 1)), InvalidArgument);
  EXPECT_EQ(job.server->count(), kWorkers);  // still open
  // Wrong lengths and non-finite values; the worker's state does not move.
  const Bytes before = c.save_state();
  EXPECT_THROW(c.answer_values(std::vector<float>(nq - 1), out), InvalidArgument);
  EXPECT_THROW(c.answer_values(query, std::span<float>(longer).first(out.size() + 1)),
               InvalidArgument);
  EXPECT_THROW(c.apply_values(std::vector<float>(nu + 1), step), InvalidArgument);
  EXPECT_THROW(c.apply_values(update, shorter), InvalidArgument);
  query[7] = std::numeric_limits<float>::quiet_NaN();
  update[nu - 1] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(c.answer_values(query, out), NonFiniteError);
  EXPECT_THROW(c.apply_values(update, step), NonFiniteError);
  EXPECT_EQ(c.save_state(), before);
  // Codecs whose replies are not float vectors, or that have no query, say so.
  auto sketch = make_compressor("sketch:rows=3,cols=400,k=40,p2=3", kDim);
  auto dense = make_compressor("dense", kDim);
  EXPECT_EQ(sketch->reply_size(MessageKind::Update), 0u);
  EXPECT_THROW(sketch->apply_values(update, step), ProtocolError);
  EXPECT_THROW(sketch->answer_values(query, out), ProtocolError);
  EXPECT_THROW(dense->answer_values(query, out), ProtocolError);
  auto agg = sketch->make_aggregator(1);
  std::vector<float> table(sketch->sum_size(MessageKind::Gradient), 1.0f);
  agg->add_sum(table, 1, 0);
  EXPECT_THROW(agg->finish_values(update), ProtocolError);
  EXPECT_EQ(agg->count(), 1u);  // still open: finish() works
  EXPECT_EQ(agg->finish().kind(), MessageKind::Query);
}

TEST(FloatReplies, ValuesBeyondTheWireFormatAreRefusedLikeItsMessages) {
  // Q̄ = Mᵀ·P̂ of a huge gradient exceeds fp16 (P̂ does not: orthonormal): the update's message
  // and its values both refuse it.
  for (bool values : {false, true}) {
    Job job("powersgd:rank=2,wire=fp16,layout=50x80+1000");
    auto& c = *job.workers[0];
    auto g = grad(0, 0);
    for (auto& x : g) x *= 1e6f;
    std::vector<float> p(c.sum_size(MessageKind::Gradient));
    c.encode_sum(g, 0, p);
    job.server->add_sum(p, 1, 0);
    std::vector<float> query(c.reply_size(MessageKind::Query));
    job.server->finish_values(query);
    std::vector<float> ans(c.sum_size(MessageKind::Answer));
    c.answer_values(query, ans);
    job.server->add_sum(ans, 1, 0);
    std::vector<float> update(c.reply_size(MessageKind::Update));
    if (values)
      EXPECT_THROW(job.server->finish_values(update), NonFiniteError);
    else
      EXPECT_THROW(job.server->finish(), NonFiniteError);
  }
}

TEST(Summable, BadSumsAreRefusedAndChangeNothing) {
  Job job("sketch:rows=3,cols=400,k=40");
  const uint64_t n = job.workers[0]->sum_size(MessageKind::Gradient);
  std::vector<float> sum(n, 0.5f);
  EXPECT_THROW(job.server->add_sum(std::vector<float>(n - 1), kWorkers, 0), InvalidArgument);
  EXPECT_THROW(job.server->add_sum(sum, 0, 0), InvalidArgument);
  EXPECT_THROW(job.server->add_sum(sum, kWorkers + 1, 0), InvalidArgument);
  sum[17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(job.server->add_sum(sum, kWorkers, 0), WireError);
  EXPECT_EQ(job.server->count(), 0u);
  sum[17] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(job.server->add_sum(sum, kWorkers, 0), WireError);
  // Nothing was taken: a whole round still works, and a second sum in the phase is refused.
  const Bytes u = round_by_sums(job, 0);
  EXPECT_GT(u.size(), kHeaderBytes);
  job.server->add(job.workers[0]->encode(grad(0, 1), 1, 0).bytes());
  sum[17] = 0.0f;
  EXPECT_THROW(job.server->add_sum(sum, 1, 1), ProtocolError);
}

TEST(Summable, CodecsWhoseMessagesDoNotSumSaySo) {
  for (const auto& spec : examples(false)) {
    auto c = make_compressor(spec, kDim);
    EXPECT_EQ(c->sum_size(MessageKind::Gradient), 0u) << spec;
    std::vector<float> out(10);
    EXPECT_THROW(c->encode_sum(grad(0, 0), 0, out), ProtocolError) << spec;
    auto agg = c->make_aggregator(2);
    EXPECT_THROW(agg->add_sum(out, 2, 0), ProtocolError) << spec;
  }
}

TEST(Summable, EncodeSumValidatesLikeEncodeAndKeepsStateOnError) {
  auto c = make_compressor("sketch:rows=3,cols=400,k=40", kDim);
  const uint64_t n = c->sum_size(MessageKind::Gradient);
  std::vector<float> out(n), g = grad(0, 0);
  EXPECT_THROW(c->encode_sum(std::vector<float>(kDim - 1), 0, out), InvalidArgument);
  std::vector<float> short_out(n - 1);
  EXPECT_THROW(c->encode_sum(g, 0, short_out), InvalidArgument);
  const Bytes before = c->save_state();
  g[123] = -std::numeric_limits<float>::infinity();
  EXPECT_THROW(c->encode_sum(g, 0, out), NonFiniteError);
  EXPECT_EQ(c->save_state(), before);
  // answer_sum needs a second round and a query of this codec.
  EXPECT_THROW(c->answer_sum(Bytes(kHeaderBytes, 0), out), ProtocolError);
}

TEST(WorkerState, SavedStateResumesBitForBit) {
  for (const auto& spec : example_specs(Layout::parse("40x100+1000"))) {
    Job a(spec);
    std::vector<float> step(kDim);
    for (uint64_t round = 0; round < 3; ++round) apply_all(a, round_by_messages(a, round), step);
    Job b(spec);
    for (uint32_t w = 0; w < kWorkers; ++w) b.workers[w]->load_state(a.workers[w]->save_state());
    b.server->load_state(a.server->save_state());
    EXPECT_EQ(round_by_messages(a, 3), round_by_messages(b, 3)) << spec;
  }
}

TEST(WorkerState, CorruptOrForeignStateIsRefusedAndChangesNothing) {
  auto c = make_compressor("topk:k=50,momentum=0.9", kDim);
  std::vector<float> step(kDim);
  (void)c->encode(grad(0, 0), 0, 0);
  const Bytes good = c->save_state();
  ASSERT_GT(good.size(), 8 * kDim);
  Bytes bad = good;
  bad[bad.size() / 2] ^= 0x10;
  EXPECT_THROW(c->load_state(bad), WireError);
  EXPECT_THROW(c->load_state(Bytes(good.begin(), good.begin() + 20)), WireError);
  EXPECT_THROW(c->load_state({}), WireError);
  auto other = make_compressor("topk:k=50,momentum=0.9", kDim + 1);
  EXPECT_THROW(other->load_state(good), WireError);
  EXPECT_EQ(c->save_state(), good);
  // A stateless codec keeps no state and takes none.
  auto plain = make_compressor("signsgd", kDim);
  EXPECT_TRUE(plain->save_state().empty());
  EXPECT_THROW(plain->load_state(good), WireError);
  EXPECT_NO_THROW(plain->load_state({}));
}

}  // namespace
}  // namespace sketchsgd
