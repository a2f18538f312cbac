// Every codec on the GPU against the same codec on the CPU: messages, updates and parameters, and
// the sketch aggregator on the GPU byte for byte.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/round.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/cuda.hpp>
#include <sketchsgd/kernels/hash.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "support/cuda.hpp"
#include "support/helpers.hpp"

namespace sketchsgd {
namespace {

/// Encodes the same gradients with one codec on each device and returns both message streams.
struct Pair {
  std::unique_ptr<Compressor> cpu, gpu;
};

Pair both(const std::string& spec, uint64_t dim) {
  return {make_compressor(spec, dim), make_compressor(spec, dim, Device::cuda())};
}

/// How closely a GPU codec's messages must match the CPU's: bit for bit; payload floats to
/// rounding (sketch tables: atomic order); or ≥ 99.9 % of payload bytes (scales from double sums
/// in another order can move a float by one ulp, and a stochastic rounding near it then differs).
enum class Match { Exact, Floats, Mostly };

/// Worker rounds on both devices with the server on the CPU: gradients, updates and parameters on
/// the GPU codec stay device memory; messages agree as `match` says, parameters exactly.
void expect_codec_agrees(const std::string& spec, Match match) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(spec + " seed " + std::to_string(seed));
  const uint64_t dim = 300007;
  auto codecs = both(spec, dim);
  auto agg = codecs.cpu->make_aggregator(1);
  std::vector<float> params = test::gaussian(dim, seed + 7);
  Dev<float> dparams(params);
  for (uint64_t round = 0; round < 3; ++round) {
    const auto g = test::gaussian(dim, seed + round, 0.1f);
    Dev<float> dg(g);
    const Message mc = codecs.cpu->encode(g, round, 0);
    const Message mg = codecs.gpu->encode(cspan(dg, dim), round, 0);
    ASSERT_EQ(mc.size(), mg.size());
    if (match == Match::Exact) {
      EXPECT_TRUE(std::equal(mc.bytes().begin(), mc.bytes().end(), mg.bytes().begin())) << round;
    } else if (match == Match::Mostly) {
      const auto pc = payload_of(mc.bytes()), pg = payload_of(mg.bytes());
      size_t differ = 0;
      for (size_t i = 0; i < pc.size(); ++i) differ += pc[i] != pg[i];
      EXPECT_LE(differ, pc.size() / 1000) << round;
    } else {
      const auto pc = payload_of(mc.bytes()), pg = payload_of(mg.bytes());
      std::vector<float> fc(pc.size() / 4), fg(pg.size() / 4);
      std::memcpy(fc.data(), pc.data(), pc.size());
      std::memcpy(fg.data(), pg.data(), pg.size());
      for (size_t i = 0; i < fc.size(); ++i) ASSERT_NEAR(fg[i], fc[i], 1e-4) << i;
    }
    agg->add(mc.bytes());
    const Message update = agg->finish();
    codecs.cpu->apply_step(update.bytes(), params, 0.5f);
    codecs.gpu->apply_step(update.bytes(), std::span<float>(dparams.get(), dim), 0.5f);
    EXPECT_BITS_EQ(dparams.host(), params) << round;
  }
  // A corrupt update changes nothing on the GPU either.
  const auto before = dparams.host();
  std::vector<uint8_t> junk(64, 0xAB);
  EXPECT_ANY_THROW(codecs.gpu->apply_step(junk, std::span<float>(dparams.get(), dim), 0.5f));
  EXPECT_BITS_EQ(dparams.host(), before);
  // Non-finite gradients are refused before any state changes.
  auto bad = test::gaussian(dim, seed);
  bad[dim - 1] = INFINITY;
  Dev<float> dbad(bad);
  EXPECT_THROW(codecs.gpu->encode(cspan(dbad, dim), 9, 0), NonFiniteError);
}

TEST(CudaCodec, DenseTopkAndSketchWorkersMatchTheCpu) {
  REQUIRE_GPU();
  expect_codec_agrees("dense:momentum=0.9", Match::Exact);
  expect_codec_agrees("topk:k=3000,momentum=0.9", Match::Exact);
  expect_codec_agrees("sketch:rows=5,cols=30000,k=3000,momentum=0.9", Match::Floats);
  expect_codec_agrees("sketch:rows=5,cols=30000,k=3000,momentum=0.9,hashing=random", Match::Floats);
  expect_codec_agrees("sketch:rows=1,cols=30000,k=3000,fetch=1", Match::Floats);
  // Compact wire and layouts: 16-bit values rounded on the host from the device's selection.
  expect_codec_agrees("topk:k=3000,momentum=0.9,wire=fp16,index=delta", Match::Exact);
  expect_codec_agrees("topk:k=3000,budget=layer,dense_below=100,layout=300x1000+7", Match::Exact);
  expect_codec_agrees("sketch:rows=1,cols=30000,k=3000,fetch=1,wire=fp16", Match::Mostly);
  expect_codec_agrees("sketch:rows=3,cols=30000,k=3000,momentum=0.9,layout=300x1000+7",
                      Match::Floats);
}

TEST(CudaCodec, QuantisingWorkersMatchTheCpu) {
  REQUIRE_GPU();
  expect_codec_agrees("signsgd:momentum=0.9", Match::Exact);
  expect_codec_agrees("terngrad:chunk=1000", Match::Exact);  // scale = max |x|: exact everywhere
  expect_codec_agrees("terngrad:ef=1,momentum=0.5", Match::Exact);
  expect_codec_agrees("signsgd:ef=1,chunk=4096,momentum=0.9", Match::Mostly);
  expect_codec_agrees("terngrad:chunk=1000,clip=2.5", Match::Mostly);
  // Scales per tensor (a layout): each tensor packed alone, from a subspan of device memory.
  expect_codec_agrees("terngrad:layout=300x1000+7", Match::Exact);
  expect_codec_agrees("signsgd:ef=1,chunk=4096,layout=300x1000+7", Match::Mostly);
  expect_codec_agrees("signsgd:momentum=0.9,layout=300x1000+7", Match::Exact);
}

/// Server side on the GPU: the same messages give the same Update bytes as the CPU aggregator
/// (sums in the same order, hashes and medians bit-identical), FetchSGD state included.
TEST(CudaCodec, SketchServerOnTheGpuMatchesTheCpuByteForByte) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const uint64_t dim = 500009;
  for (const char* spec :
       {"sketch:rows=5,cols=50000,k=5000", "sketch:rows=1,cols=50000,k=5000,fetch=1",
        // The update delta-coded on the device.
        "sketch:rows=5,cols=50000,k=5000,index=delta",
        "sketch:rows=3,cols=50000,k=4000,fetch=1,index=delta",
        "sketch:rows=3,cols=50000,k=2000,p2=2",
        // A layout (500 x 1000 + 9): the bias whole, the selection past it, resets uploaded.
        "sketch:rows=1,cols=50000,k=5000,fetch=1,layout=500x1000+9"}) {
    SCOPED_TRACE(spec);
    auto workers = both(spec, dim);
    auto cpu = workers.cpu->make_aggregator(2), gpu = workers.gpu->make_aggregator(2);
    auto w1 = make_compressor(spec, dim);
    for (uint64_t round = 0; round < 3; ++round) {
      const Message a = workers.cpu->encode(test::gaussian(dim, seed + round), round, 0);
      const Message b = w1->encode(test::gaussian(dim, seed + 100 + round), round, 1);
      for (auto* agg : {cpu.get(), gpu.get()}) {
        agg->add(a.bytes());
        agg->add(b.bytes());
      }
      Message uc = cpu->finish(), ug = gpu->finish();
      ASSERT_EQ(uc.size(), ug.size());
      if (workers.cpu->two_rounds()) {  // Query → Answers → Update
        ASSERT_TRUE(std::equal(uc.bytes().begin(), uc.bytes().end(), ug.bytes().begin()));
        const Message qa = workers.cpu->answer(uc.bytes(), 0), qb = w1->answer(uc.bytes(), 1);
        for (auto* agg : {cpu.get(), gpu.get()}) {
          agg->add(qa.bytes());
          agg->add(qb.bytes());
        }
        uc = cpu->finish();
        ug = gpu->finish();
        ASSERT_EQ(uc.size(), ug.size());
      }
      EXPECT_TRUE(std::equal(uc.bytes().begin(), uc.bytes().end(), ug.bytes().begin())) << round;
      std::vector<float> step(dim);
      workers.cpu->apply(uc.bytes(), step);
      w1->apply(uc.bytes(), step);
    }
    EXPECT_EQ(cpu->save_state(), gpu->save_state());
    auto restored = workers.gpu->make_aggregator(2);
    restored->load_state(cpu->save_state());
    EXPECT_EQ(restored->save_state(), cpu->save_state());

    // A well-formed message carrying a NaN cell is refused by the GPU aggregator (validated on
    // the device) exactly as on the CPU, and the round goes on without it.
    std::vector<float> cells(workers.cpu->max_payload(MessageKind::Gradient) / 4, 0.5f);
    cells[cells.size() / 3] = std::nanf("");
    const Message poisoned = Message::build(
        Header{workers.cpu->id(), MessageKind::Gradient, workers.cpu->dim(), 3, 0, 0},
        cells.size() * 4, [&](ByteWriter& w) { w.put_array(std::span<const float>(cells)); });
    EXPECT_THROW(cpu->add(poisoned.bytes()), WireError);
    EXPECT_THROW(gpu->add(poisoned.bytes()), WireError);
    EXPECT_EQ(gpu->count(), 0u);
  }
}

}  // namespace
}  // namespace sketchsgd

namespace sketchsgd {
namespace {

/// Collectives on the GPU: encode_sum() writes device memory, add_sum() takes a device sum, and
/// the result equals the CPU aggregator's on the same sum, byte for byte; no host vector needed.
TEST(CudaCodec, SummedPayloadsStayOnTheDeviceAndMatchTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const uint64_t dim = 300007;
  for (const char* spec : {"dense:momentum=0.9", "sketch:rows=5,cols=30000,k=3000",
                           "sketch:rows=3,cols=30000,k=2000,p2=2"}) {
    SCOPED_TRACE(spec);
    auto cpu = make_compressor(spec, dim);
    auto gpu = make_compressor(spec, dim, Device::cuda(0));
    auto agg_cpu = cpu->make_aggregator(1), agg_gpu = gpu->make_aggregator(1);
    const auto g = test::gaussian(dim, seed);
    Dev<float> dg(g);
    const uint64_t n = gpu->sum_size(MessageKind::Gradient);
    Dev<float> dout(n);
    std::vector<float> hout(n);
    gpu->encode_sum(cspan(dg, dim), 0, std::span<float>(dout.get(), n));
    cpu->encode_sum(g, 0, hout);
    const auto from_gpu = dout.host();
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(from_gpu[i], hout[i], 1e-4f * (1 + std::fabs(hout[i])));
    EXPECT_THROW(agg_gpu->add_sum(from_gpu, 1, 0), InvalidArgument);  // host memory
    agg_gpu->add_sum(cspan(dout, n), 1, 0);
    agg_cpu->add_sum(from_gpu, 1, 0);
    Message uc = agg_cpu->finish(), ug = agg_gpu->finish();
    ASSERT_TRUE(
        std::equal(uc.bytes().begin(), uc.bytes().end(), ug.bytes().begin(), ug.bytes().end()));
    if (gpu->two_rounds()) {
      const uint64_t m = gpu->sum_size(MessageKind::Answer);
      Dev<float> dans(m);
      std::vector<float> hans(m);
      gpu->answer_sum(ug.bytes(), std::span<float>(dans.get(), m));
      cpu->answer_sum(uc.bytes(), hans);
      agg_gpu->add_sum(cspan(dans, m), 1, 0);
      agg_cpu->add_sum(hans, 1, 0);
      uc = agg_cpu->finish();
      ug = agg_gpu->finish();
      EXPECT_EQ(uc.size(), ug.size());
    }
    Dev<float> dstep(dim);
    std::vector<float> hstep(dim);
    gpu->apply(ug.bytes(), std::span<float>(dstep.get(), dim));
    cpu->apply(uc.bytes(), hstep);
    if (gpu->id() == CodecId::Dense) EXPECT_BITS_EQ(dstep.host(), hstep);
  }
}

}  // namespace
}  // namespace sketchsgd

namespace sketchsgd {
namespace {

/// PowerSGD with cuBLAS against OpenBLAS: the same two-phase rounds (server on the CPU), factors
/// and parameters equal to float rounding (the two libraries sum products in other orders), and
/// the summable payloads written to device memory.
TEST(CudaCodec, PowerSGDOnTheGpuMatchesTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const std::string spec = "powersgd:rank=4,momentum=0.9,layout=300x500+300+10x300+10";
  const uint64_t dim = 300 * 500 + 300 + 3000 + 10;
  auto cpu = make_compressor(spec, dim);
  auto gpu = make_compressor(spec, dim, Device::cuda());
  auto agg = cpu->make_aggregator(1);
  std::vector<float> params = test::gaussian(dim, seed + 7);
  Dev<float> dparams(params);
  auto near = [](std::span<const uint8_t> a, std::span<const uint8_t> b) {
    ASSERT_EQ(a.size(), b.size());
    std::vector<float> fa(a.size() / 4), fb(b.size() / 4);
    std::memcpy(fa.data(), a.data(), a.size());
    std::memcpy(fb.data(), b.data(), b.size());
    for (size_t i = 0; i < fa.size(); ++i)
      ASSERT_NEAR(fb[i], fa[i], 1e-3f * (1.0f + std::fabs(fa[i]))) << i;
  };
  for (uint64_t round = 0; round < 3; ++round) {
    const auto g = test::gaussian(dim, seed + round, 0.1f);
    Dev<float> dg(g);
    const Message pc = cpu->encode(g, round, 0), pg = gpu->encode(cspan(dg, dim), round, 0);
    near(payload_of(pc.bytes()), payload_of(pg.bytes()));
    agg->add(pc.bytes());
    const Message q = agg->finish();
    const Message ac = cpu->answer(q.bytes(), 0), ag = gpu->answer(q.bytes(), 0);
    near(payload_of(ac.bytes()), payload_of(ag.bytes()));
    agg->add(ac.bytes());
    const Message u = agg->finish();
    cpu->apply_step(u.bytes(), params, 0.5f);
    gpu->apply_step(u.bytes(), std::span<float>(dparams.get(), dim), 0.5f);
    const auto got = dparams.host();
    for (size_t i = 0; i < dim; ++i) ASSERT_NEAR(got[i], params[i], 1e-4f) << i;
  }
  // The collective path: P into device memory.
  const auto g = test::gaussian(dim, seed + 9, 0.1f);
  Dev<float> dg(g), dout(std::vector<float>(gpu->sum_size(MessageKind::Gradient)));
  std::vector<float> hout(cpu->sum_size(MessageKind::Gradient));
  cpu->encode_sum(g, 0, hout);
  gpu->encode_sum(cspan(dg, dim), 0, std::span<float>(dout.get(), hout.size()));
  const auto back = dout.host();
  for (size_t i = 0; i < hout.size(); ++i)
    ASSERT_NEAR(back[i], hout[i], 1e-3f * (1 + std::fabs(hout[i])));
}

/// The PowerSGD tests' layout: a 300 × 500 matrix and its bias, a 10 × 300 one and its bias.
constexpr uint64_t kPowerDim = 300 * 500 + 300 + 3000 + 10;

/// Both of PowerSGD's phases on the device, the aggregator's included, as the DDP hook runs them:
/// encode_sum, add_sum, finish_values, answer_values, apply_values. Steps match the CPU's message
/// path to float rounding and the GPU's own message path bit for bit, with no host values.
TEST(CudaCodec, PowerSGDPhasesStayOnTheDevice) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed(), dim = kPowerDim;
  SCOPED_TRACE(seed);
  for (const char* spec :
       {"powersgd:rank=4,momentum=0.9,layout=300x500+300+10x300+10",
        "powersgd:rank=16,wire=fp16,layout=300x500+300+10x300+10",
        // FSDP's sharded layout: two chunks, each matrix's rows in two blocks
        "powersgd:rank=4,blocks=2,layout=150x500+150+5x300+5+150x500+150+5x300+5"}) {
    SCOPED_TRACE(spec);
    auto cpu = make_compressor(spec, dim);
    auto by_values = make_compressor(spec, dim, Device::cuda());
    auto by_bytes = make_compressor(spec, dim, Device::cuda());
    auto agg_cpu = cpu->make_aggregator(1), agg_values = by_values->make_aggregator(1),
         agg_bytes = by_bytes->make_aggregator(1);
    const uint64_t np = cpu->sum_size(MessageKind::Gradient),
                   na = cpu->sum_size(MessageKind::Answer);
    const uint64_t nq = cpu->reply_size(MessageKind::Query),
                   nu = cpu->reply_size(MessageKind::Update);
    for (uint64_t round = 0; round < 3; ++round) {
      const auto g = test::gaussian(dim, seed + round, 0.1f);
      Dev<float> dg(g);
      // CPU, messages.
      std::vector<float> p(np), a(na), step(dim);
      cpu->encode_sum(g, round, p);
      agg_cpu->add_sum(p, 1, round);
      const Message q = agg_cpu->finish();
      cpu->answer_sum(q.bytes(), a);
      agg_cpu->add_sum(a, 1, round);
      cpu->apply(agg_cpu->finish().bytes(), step);
      // GPU, values.
      Dev<float> vp(np), vq(nq), va(na), vu(nu), vstep(dim);
      by_values->encode_sum(cspan(dg, dim), round, {vp.get(), np});
      agg_values->add_sum(cspan(vp, np), 1, round);
      agg_values->finish_values({vq.get(), nq});
      by_values->answer_values(cspan(vq, nq), {va.get(), na});
      agg_values->add_sum(cspan(va, na), 1, round);
      agg_values->finish_values({vu.get(), nu});
      by_values->apply_values(cspan(vu, nu), {vstep.get(), dim});
      // GPU, messages between the phases.
      Dev<float> bp(np), ba(na), bstep(dim);
      by_bytes->encode_sum(cspan(dg, dim), round, {bp.get(), np});
      agg_bytes->add_sum(cspan(bp, np), 1, round);
      const Message bq = agg_bytes->finish();
      by_bytes->answer_sum(bq.bytes(), {ba.get(), na});
      agg_bytes->add_sum(cspan(ba, na), 1, round);
      by_bytes->apply(agg_bytes->finish().bytes(), {bstep.get(), dim});

      const auto got = vstep.host();
      EXPECT_BITS_EQ(got, bstep.host()) << round;
      for (size_t i = 0; i < dim; ++i)
        ASSERT_NEAR(got[i], step[i], 2e-3f * (1.0f + std::fabs(step[i]))) << round << " " << i;
    }
    EXPECT_EQ(by_values->save_state(), by_bytes->save_state());
  }
}

// A round on the GPU that keeps a part of the buffer (a rank's chunk under FSDP): PowerSGD
// writes only those rows of its step, and its error feedback covers every row (the later rounds
// agree too). Parts that cut a matrix's rows anywhere and a block's edge; rank 6 keeps the
// subtraction in the step's pass.
TEST(CudaCodec, PowerSGDRoundFinishesAPartOnTheDevice) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed(), dim = kPowerDim;
  SCOPED_TRACE(seed);
  for (const char* spec :
       {"powersgd:rank=4,blocks=2,layout=150x500+150+5x300+5+150x500+150+5x300+5",
        "powersgd:rank=6,layout=300x500+300+10x300+10"}) {
    for (const auto& [lo, hi] : {std::pair<uint64_t, uint64_t>{dim / 2, dim}, {1234, 77777}}) {
      SCOPED_TRACE(std::string(spec) + " part " + std::to_string(lo));
      auto whole = make_compressor(spec, dim, Device::cuda());
      auto part = make_compressor(spec, dim, Device::cuda());
      auto agg_whole = whole->make_aggregator(1), agg_part = part->make_aggregator(1);
      const uint64_t np = Round::payload_size(whole.get(), 0), na = Round::answer_size(whole.get());
      Dev<float> pw(np), aw(na), pp(np), ap(na);
      Round rw(*whole, *agg_whole, 0, 0, {{pw.get(), np}, {aw.get(), na}});
      Round rp(*part, *agg_part, 0, 0, {{pp.get(), np}, {ap.get(), na}});
      const std::vector<Layout::Run> kept{{0, dim}}, none;
      for (uint64_t round = 0; round < 3; ++round) {
        const auto g = test::gaussian(dim, seed + round, 0.1f);
        Dev<float> bw(g), bp(g), out(hi - lo);
        rw.start(cspan(bw, dim), {kept, none}, round);  // a group of one: each room is its sum
        rw.next({});
        rw.finish({}, std::span<float>(bw.get(), dim), {kept, none});
        rp.start(cspan(bp, dim), {kept, none}, round);
        rp.next({});
        rp.finish({}, std::span<float>(out.get(), hi - lo), lo, dim, {kept, none});
        const auto full = bw.host(), got = out.host();
        for (uint64_t i = 0; i < hi - lo; ++i)
          ASSERT_NEAR(got[i], full[lo + i], 1e-5f * (1.0f + std::fabs(full[lo + i])))
              << round << " " << lo + i;
        EXPECT_BITS_EQ(bp.host(), g) << "the buffer is read, not written";
      }
    }
  }
}

}  // namespace
}  // namespace sketchsgd
