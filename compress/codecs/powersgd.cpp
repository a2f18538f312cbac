// powersgd: PowerSGD (Vogels et al. 2019), rank-r approximations with error feedback, computed as
// torch.distributed's powerSGD_hook does. It needs the layout: every tensor whose matrix view
// (rows × cols) is worth it — (rows + cols)·r·min_rate < rows·cols — is approximated by rank-r
// factors; the others (biases, small tensors) travel uncompressed. Two summable phases a round:
//   Gradient: worker i sends P_i = M_i·Q per matrix, M_i = its gradient + error, Q the last
//             round's mean Q orthonormalised (warm start; random at first), and its
//             uncompressed tensors;
//   Query:    the server orthonormalises ΣP_i into P̂ (the same column space as the mean);
//   Answer:   worker i sends Q_i = M_iᵀ·P̂;
//   Update:   P̂, Q̄ = ΣQ_i / W and the uncompressed tensors' mean. The step is P̂·Q̄ᵀ (the mean
//             gradient projected on P̂'s columns); workers keep M_i − P̂·Q̄ᵀ as their error and
//             Q̄ for the next round.
// momentum > 0: workers compress their local momentum (ρ·u + g) instead of the gradient, for a
// server that applies the update as is (the parameter server). blocks = B: the layout is B chunks
// of the same tensors, and tensor j of chunk b holds rows b·n/B.. of matrix j (FSDP's sharded
// layout, each rank's rows of every parameter end to end): each matrix is factored whole, its
// row blocks read where they lie, with no copy into parameter order. Its products are taken
// block by block (P's rows and the step's are a block's own; Q = Σ_b M_bᵀ·P_b), so the result
// is the unblocked one up to the summation order of Q. Matrix products: on the CPU,
// kernels::cpu::lowrank_* with the error feedback fused into the first and last products (a
// round streams the matrix seven times, where OpenBLAS's packing and separate error passes
// stream it about twelve; BENCHMARKS.md, sketchsgd_bench LowRank, compares their speed); at ranks
// up to 4 five times, the error's subtraction deferred from the step's pass to the next absorb
// (defers()). On a GPU everything stays on the device: cuBLAS
// products (ops::gemm), one launch orthonormalising every factor (ops::orthonormalize), and
// replies that are float vectors (reply_size()), so a DDP hook passes device tensors between the
// phases.
#include <algorithm>
#include <cstring>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "../payload.hpp"
#include "../summable.hpp"
#include "powersgd_plan.hpp"

namespace sketchsgd {
namespace {

using powersgd::Plan;

struct PowerOptions {
  uint64_t rank;
  float momentum;
  bool ef, warm;
  uint64_t seed;
  WireFloat wire;
};

/// Uniform values in [−1, 1) from integer arithmetic only, so every worker and server builds the
/// same first Q whatever its libm (SplitMix64 of seed and position).
void random_q(std::span<float> q, uint64_t seed) {
  for (size_t i = 0; i < q.size(); ++i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    q[i] = float(int32_t(uint32_t(z >> 32))) * 0x1p-31f;
  }
}

class PowerAggregator final : public SummableAggregator {
 public:
  PowerAggregator(const Compressor& c, uint32_t world, const Plan& plan)
      : SummableAggregator(c, world),
        plan_(plan),
        p_factors_(plan.factors(false), c.device()),
        p_hat_(plan.p_size, c.device()),
        dense_mean_(plan.dense_size, c.device()) {}

 private:
  /// Gradient (ΣP_i, the uncompressed tensors' sum) → the Query P̂; Answer (ΣQ_i) → the Update
  /// P̂ | Q̄ | the uncompressed tensors' mean.
  void reduce_to(std::span<float> sum, const Header& phase, uint32_t contributors,
                 std::span<float> out) override {
    const float inv = 1.0f / float(contributors);
    const uint64_t np = plan_.p_size, nq = plan_.q_size;
    if (phase.kind == MessageKind::Gradient) {
      // Orthonormalising the sum spans the mean's column space; the uncompressed part waits for
      // the update.
      ops::copy(device_, out, sum.first(np));
      ops::orthonormalize(device_, scratch_, out, p_factors_);
      ops::copy(device_, p_hat_.span(), out);
      ops::scale(device_, dense_mean_.span(), sum.subspan(np), inv);
      return;
    }
    // On a GPU each move is a host call: the update's three parts take two.
    ops::scale(device_, out.subspan(np, nq), sum, inv);
    const kernels::Piece kept[] = {{out.data(), p_hat_.data(), np},
                                   {out.data() + np + nq, dense_mean_.data(), dense_mean_.size()}};
    ops::scale_pieces(device_, kept, 1.0f);
  }

  const Plan plan_;
  const ops::Factors p_factors_;
  Buffer<float> p_hat_, dense_mean_;  // from the Gradient phase, for the update
  Scratch scratch_;
};

class PowerSGD final : public SummableCodec {
 public:
  PowerSGD(uint64_t dim, std::string spec, const Plan& plan, const PowerOptions& o,
           const Device& device)
      : SummableCodec(CodecId::PowerSGD, dim, std::move(spec), device, o.wire, o.wire),
        plan_(plan),
        o_(o),
        fb_(dim, o.momentum, true, device),  // its error vector holds M from encode to apply
        fused_(ops::fuses_lowrank_absorb(device)),
        q_factors_(plan.factors(true), device),
        q_(plan.q_size, device),
        qo_(plan.q_size, device) {
    // The gradient is checked before the encode (Compressor::encode), not in the fused pass:
    // a NaN found there would leave the tensors before it absorbed, which only a subtraction
    // could take back, to rounding; checked first, a refused gradient leaves every bit as it was.
    reset_q(o.seed);
  }

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<PowerAggregator>(*this, world, plan_);
  }
  uint64_t sum_size(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return plan_.p_size + plan_.dense_size;
    return kind == MessageKind::Answer ? plan_.q_size : 0;
  }
  uint64_t reply_size(MessageKind kind) const override {
    if (kind == MessageKind::Query) return plan_.p_size;
    return kind == MessageKind::Update ? plan_.p_size + plan_.q_size + plan_.dense_size : 0;
  }
  /// P and Q are rows of rank values, their columns' magnitudes the singular values': a scale
  /// per column keeps the small ones (the matrices' ranks alike; else the values in a row).
  uint64_t sum_columns(MessageKind) const override {
    for (const auto& m : plan_.matrices)
      if (m.rank != o_.rank) return 1;
    return o_.rank;
  }
  /// The factors; the tensors sent as they are follow P.
  uint64_t sum_grouped(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return plan_.p_size;
    return kind == MessageKind::Answer ? plan_.q_size : 0;
  }

 private:
  /// The next Q before orthonormalisation: random from seed (integer arithmetic, the same on
  /// every worker and device).
  void reset_q(uint64_t seed) {
    std::vector<float> q(plan_.q_size);
    random_q(q, seed);
    q_.upload(q);
  }

  /// M = g + error; P_i = M·Q per matrix (Q: the warm-started mean, orthonormalised) into p, the
  /// uncompressed tensors after it (p and dense in the device's memory).
  void compute_p(std::span<const float> g, uint64_t round, float* p, float* dense,
                 const char* what) {
    if (!o_.warm && round != last_round_) reset_q(o_.seed ^ (round * 0xD1B54A32D192ED03ull));
    last_round_ = round;
    ops::copy(device(), qo_.span(), q_.span());
    // Q̄ = q·R: a deferred subtraction P̂·Q̄ᵀ is (P̂·Rᵀ)·qᵀ, on the columns absorb reads anyway.
    rr_.resize(plan_.r_size);
    ops::orthonormalize(device(), ops_, qo_.span(), q_factors_, deferred_ ? rr_.data() : nullptr);
    if (fused_) return fused_p(g, p, dense, what);
    const auto m = fb_.absorb(g);
    for (const auto& x : plan_.matrices)
      x.each_block([&](uint64_t at, uint64_t p_at, uint64_t rows) {
        ops::gemm(device(), false, false, rows, x.rank, x.cols, 1.0f, m.data() + at, x.cols,
                  qo_.data() + x.q_at, x.rank, 0.0f, p + p_at, x.rank);
      });
    ops::scale_pieces(device(), dense_pieces(dense, m.data(), true), 1.0f);
  }

  /// One piece per uncompressed tensor, between its run of the vector and its place in the
  /// packed array after the factors (to_packed: from the vector): on a GPU the tensors move in
  /// one launch, where a copy each was a host call each.
  std::vector<kernels::Piece> dense_pieces(float* dst, const float* src, bool to_packed) const {
    std::vector<kernels::Piece> out;
    out.reserve(plan_.dense.size());
    for (const auto& d : plan_.dense)
      out.push_back(to_packed ? kernels::Piece{dst + d.at, src + d.offset, d.numel}
                              : kernels::Piece{dst + d.offset, src + d.at, d.numel});
    return out;
  }

  /// compute_p on the CPU: M = g (or the momentum) + error and P = M·Q in one pass (g is finite:
  /// checked before the encode).
  void fused_p(std::span<const float> g, float* p, float* dense, const char* what) {
    bool finite = true;
    const auto m = fb_.error();
    const auto u = fb_.momentum();
    auto at = [](std::span<float> v, uint64_t o) { return v.empty() ? nullptr : v.data() + o; };
    for (const auto& x : plan_.matrices) {
      const bool owed = deferred_ && defers(x);
      if (owed) {  // a = P̂·Rᵀ (R upper triangular)
        shifted_.resize(x.rows * x.rank);
        kernels::cpu::times_upper_transposed(deferred_p_.data() + x.p_at, rr_.data() + x.r_at,
                                             shifted_.data(), x.rows, x.rank);
      }
      const float* qx = qo_.data() + x.q_at;
      x.each_block([&](uint64_t o, uint64_t p_at, uint64_t rows) {
        const float* owed_rows = owed ? shifted_.data() + (p_at - x.p_at) : nullptr;
        finite &= kernels::cpu::lowrank_absorb(m.data() + o, g.data() + o, at(u, o), fb_.rho(), qx,
                                               p + p_at, rows, x.cols, x.rank, owed_rows,
                                               owed ? qx : nullptr);
      });
    }
    deferred_ = false;
    for (const auto& d : plan_.dense) {
      finite &=
          kernels::cpu::lowrank_absorb(m.data() + d.offset, g.data() + d.offset, at(u, d.offset),
                                       fb_.rho(), nullptr, nullptr, 1, d.numel, 0);
      std::memcpy(dense + d.at, m.data() + d.offset, d.numel * sizeof(float));
    }
    SKETCHSGD_REQUIRE(finite, Error, what,
                      ": the gradient changed during the encode (non-finite after the check)");
  }

  void do_encode_sum(std::span<const float> g, uint64_t round, std::span<float> out) override {
    compute_p(g, round, out.data(), out.data() + plan_.p_size, "encode");
  }

  /// Q_i = Mᵀ·P̂ per matrix into out (P̂: the Query's values; both in the device's memory); a
  /// matrix in blocks sums its blocks' products.
  void do_answer_values(std::span<const float> p, std::span<float> out) override {
    const auto m = fb_.error();
    for (const auto& x : plan_.matrices)
      x.each_block([&](uint64_t at, uint64_t p_at, uint64_t rows) {
        float* q = out.data() + x.q_at;
        if (p_at != x.p_at) {  // a later block: into a room, then added
          if (block_q_.size() < x.cols * x.rank)
            block_q_ = Buffer<float>(x.cols * x.rank, device());
          q = block_q_.data();
        }
        ops::lowrank_answer(device(), m.data() + at, p.data() + p_at, q, rows, x.cols, x.rank);
        if (q != out.data() + x.q_at)
          ops::axpy(device(), out.subspan(x.q_at, x.cols * x.rank),
                    block_q_.span().first(x.cols * x.rank), 1.0f);
      });
  }

  /// Whether matrix x's error subtraction waits for the next absorb: on the CPU at ranks up to
  /// 4, where both passes are bound by memory, the step's pass then only writes the step (two
  /// streams over M fewer a round) and absorb subtracts P̂·Q̄ᵀ as it reads M anyway, on the
  /// columns of the warm-started q (so warm=1). Past 4 the products are bound by the FMA units
  /// and the subtraction stays in the step's pass.
  bool defers(const Plan::Matrix& x) const { return fused_ && owes(x); }
  /// Whether matrix x's subtraction is deferred by a codec that defers at all (a saved state's
  /// owed P̂ covers these matrices, whichever codec loads it).
  bool owes(const Plan::Matrix& x) const { return o_.ef && o_.warm && x.rank <= 4; }

  /// Writes out a deferred subtraction (the error as it would be without the deferral; Q̄ is
  /// the warm start): p, the owed P̂ in the device's memory.
  void settle(const float* p) const {
    const auto e = fb_.error();
    for (const auto& x : plan_.matrices)
      if (owes(x))
        x.each_block([&](uint64_t at, uint64_t p_at, uint64_t rows) {
          ops::lowrank_expand(device(), p + p_at, q_.data() + x.q_at, nullptr, rows, x.cols, x.rank,
                              e.data() + at);
        });
  }
  void settle() const {
    if (!deferred_) return;
    settle(deferred_p_.data());  // deferred on the CPU alone: host memory is the device's
    deferred_ = false;
  }

  /// The step P̂·Q̄ᵀ per matrix and the uncompressed values, its values [lo, lo + step.size())
  /// only (into step), and error −= step when `error` is given (the error feedback with the
  /// step: every row, in the window or not), but for the matrices that defer it. Rows outside
  /// the window are expanded only for the error, and not at all where it is deferred: under
  /// FSDP a rank keeps 1/W of the step. streamed: step's rows by streaming stores.
  void write_step(std::span<const float> update, std::span<float> step, uint64_t lo, float* error,
                  bool streamed) {
    const float* p = update.data();
    const float* q = p + plan_.p_size;
    const float* dense = q + plan_.q_size;
    const uint64_t hi = lo + step.size();
    for (const auto& x : plan_.matrices)
      x.each_block([&](uint64_t at, uint64_t p_at, uint64_t rows) {
        float* e = error && !defers(x) ? error + at : nullptr;
        const uint64_t from = std::clamp(at, lo, hi), to = std::clamp(at + rows * x.cols, lo, hi);
        // Rows [a, b), into out (null: the error alone); the step's own rows may be streamed.
        auto expand = [&](uint64_t a, uint64_t b, float* out, bool in_step = false) {
          if (a < b && (out || e))
            ops::lowrank_expand(device(), p + p_at + a * x.rank, q + x.q_at, out, b - a, x.cols,
                                x.rank, e ? e + a * x.cols : nullptr, in_step && streamed);
        };
        if (to <= from) return expand(0, rows, nullptr);  // none in the window
        // Rows [r0, r1) hold the block's values in the window, rows [f0, f1) wholly.
        const uint64_t r0 = (from - at) / x.cols, r1 = (to - at + x.cols - 1) / x.cols;
        const uint64_t f0 = (from - at + x.cols - 1) / x.cols, f1 = (to - at) / x.cols;
        // A row the window's ends cut (FSDP1's chunks cut matrices anywhere): through a room.
        auto cut = [&](uint64_t i) {
          if (cut_row_.size() < x.cols) cut_row_ = Buffer<float>(x.cols, device());
          expand(i, i + 1, cut_row_.data());
          const uint64_t row = at + i * x.cols, a = std::max(from, row);
          const uint64_t b = std::min(to, row + x.cols);
          ops::copy(device(), step.subspan(a - lo, b - a), cut_row_.span().subspan(a - row, b - a));
        };
        expand(0, r0, nullptr);
        expand(r1, rows, nullptr);
        if (f0 > f1) return cut(r0);  // the window inside one row
        if (r0 < f0) cut(r0);
        expand(f0, f1, step.data() + (at + f0 * x.cols - lo), true);
        if (f1 < r1) cut(f1);
      });
    std::vector<kernels::Piece> parts;
    for (const auto& d : plan_.dense) {
      const uint64_t from = std::clamp(d.offset, lo, hi),
                     to = std::clamp(d.offset + d.numel, lo, hi);
      if (to > from)
        parts.push_back({step.data() + (from - lo), dense + d.at + (from - d.offset), to - from});
    }
    ops::scale_pieces(device(), parts, 1.0f);
  }
  void do_apply_values(std::span<const float> update, std::span<float> step) override {
    do_apply_window(update, step, 0, false);
  }
  void do_apply_window(std::span<const float> update, std::span<float> step, uint64_t lo,
                       bool streamed) override {
    SKETCHSGD_REQUIRE(lo <= dim() && step.size() <= dim() - lo, InvalidArgument,
                      "powersgd: values [", lo, ", +", step.size(), ") of a step of ", dim());
    // Error: M − P̂·Q̄ᵀ on the matrices (ef=1), nothing elsewhere (sent exactly); Q̄ for the
    // next round's warm start.
    settle();  // an apply with no encode since the last one
    const auto e = fb_.error();
    write_step(update, step, lo, o_.ef ? e.data() : nullptr, streamed);  // or the next absorb
    if (o_.ef && std::any_of(plan_.matrices.begin(), plan_.matrices.end(),
                             [&](const Plan::Matrix& x) { return defers(x); })) {
      deferred_p_.assign(update.begin(), update.begin() + plan_.p_size);
      deferred_ = true;
    }
    // The error is zeroed where nothing is owed: the tensors sent whole, and without ef the
    // matrices too (0 · M, as a scale by 0 is; M is finite, checked at the encode).
    std::vector<kernels::Piece> owed_nothing;
    if (!o_.ef)
      for (const auto& x : plan_.matrices)
        x.each_block([&](uint64_t at, uint64_t, uint64_t rows) {
          owed_nothing.push_back({e.data() + at, e.data() + at, rows * x.cols});
        });
    for (const auto& d : plan_.dense)
      owed_nothing.push_back({e.data() + d.offset, e.data() + d.offset, d.numel});
    ops::scale_pieces(device(), owed_nothing, 0.0f);
    if (o_.warm) ops::copy(device(), q_.span(), update.subspan(plan_.p_size, plan_.q_size));
  }

  // Worker state: the error (between rounds), the warm-start Q, and a deferred subtraction's P̂
  // (none: 0 values). Saved as it is, not settled: writing the subtraction out would round the
  // error otherwise than the next absorb does, so a job that saved would part from one that did
  // not (and a resumed one from the saved one's continuation).
  Bytes do_save_state() const override {
    Bytes out;
    ByteWriter w(out);
    const Bytes fb = fb_.save();
    w.put(uint64_t(fb.size()));
    w.put_array(std::span<const uint8_t>(fb));
    const auto q = q_.to_vector();
    w.put(uint64_t(q.size()));
    w.put_array(std::span<const float>(q));
    const uint64_t np = deferred_ ? plan_.p_size : 0;
    w.put(np);
    w.put_array(std::span<const float>(deferred_p_.data(), np));
    seal(out);
    return out;
  }
  void do_load_state(std::span<const uint8_t> state) override {
    ByteReader r(unseal(state, "powersgd state"), "powersgd state");
    const auto fb = r.take<uint8_t>(r.get<uint64_t>());
    const auto nq = r.get<uint64_t>();
    SKETCHSGD_REQUIRE(nq == q_.size(), WireError, "powersgd state with ", nq,
                      " Q values for a codec of ", q_.size());
    const auto q = payload::read_floats(r, nq, "powersgd state Q");
    std::vector<float> owed;
    if (r.left() > 0) {  // (a state saved before the field was: settled, nothing owed)
      const auto np = r.get<uint64_t>();
      SKETCHSGD_REQUIRE(np == 0 || np == plan_.p_size, WireError, "powersgd state with ", np,
                        " owed P values for a codec of ", plan_.p_size);
      owed = payload::read_floats(r, np, "powersgd state P");
    }
    r.expect_end();
    fb_.load(fb);  // validates everything before it changes anything
    q_.upload(q);
    deferred_ = false;
    if (owed.empty()) return;
    if (fused_) {  // this codec defers too: owed as saved
      deferred_p_ = std::move(owed);
      deferred_ = true;
      return;
    }
    Buffer<float> p(owed.size(), device());  // another device: written out now
    p.upload(owed);
    settle(p.data());
  }

  const Plan plan_;
  const PowerOptions o_;
  mutable Feedback fb_;  // mutable: settle() (const) writes a deferred subtraction out
  const bool fused_;     // ops::fuses_lowrank_absorb(): compute_p in one pass (fused_p)
  const ops::Factors q_factors_;
  Buffer<float> q_;   // the next round's Q before orthonormalisation
  Buffer<float> qo_;  // this round's, orthonormalised
  // The last update's P̂ while its error subtraction is owed (defers(); Q̄ is q_), host.
  mutable std::vector<float> deferred_p_;
  mutable bool deferred_ = false;
  std::vector<float> rr_, shifted_;  // compute_p's R blocks and P̂·Rᵀ (CPU)
  Buffer<float> block_q_;            // a later row block's Mᵀ·P̂, before it is added
  Buffer<float> cut_row_;            // a row of the step that a window's end cuts, before the copy
  uint64_t last_round_ = ~uint64_t(0);
};

/// The plan of a spec's options (its layout, rank, min_rate and blocks).
Plan plan_of(const Options& o) {
  return Plan(o.layout(), o.integer("rank"), o.number("min_rate"), o.integer("blocks"));
}

SKETCHSGD_REGISTER_CODEC(
    kPowerSGD,
    {"powersgd",
     "PowerSGD: rank-r factors of each matrix of the layout (required) with error feedback and "
     "warm start; two summable phases (P, then Q)",
     {{"rank", "approximation rank r of each matrix", 4, 1, 1024},
      {"momentum", "worker momentum rho before compression (0: the optimiser's instead)", 0, 0,
       0.999, false},
      {"min_rate", "compress a matrix only when (rows + cols) * r * min_rate < rows * cols", 2, 0,
       1e6, false},
      {"ef", "1: error feedback (keep what the approximation missed)", 1, 0, 1},
      {"warm", "1: start each round's power iteration from the last round's Q", 1, 0, 1},
      {"seed", "seed of the first Q, shared by workers and server", 1, 0, 4294967295.0},
      {"blocks",
       "the layout is this many chunks of the same tensors, tensor j of chunk b the b-th block "
       "of rows of matrix j (FSDP's sharded layout): each matrix factored whole, read in place",
       1, 1, 65536},
      {"wire",
       "format of P, Q and the uncompressed values on the wire (int8: a scale per column of "
       "64 rows, replies in fp16)",
       0,
       0,
       3,
       true,
       {"fp32", "fp16", "bf16", "int8"}}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       SKETCHSGD_REQUIRE(!o.layout().empty(), InvalidArgument,
                         "powersgd needs the tensors' shapes: add layout=<shapes> to the spec "
                         "(e.g. layout=1024x784+1024), or build it with make_compressor(spec, "
                         "layout)");
       PowerOptions p{o.integer("rank"), float(o.number("momentum")), o.flag("ef"),
                      o.flag("warm"),    o.integer("seed"),           WireFloat(o.integer("wire"))};
       const Plan plan = plan_of(o);
       SKETCHSGD_REQUIRE(!plan.matrices.empty(), InvalidArgument, "powersgd: no tensor of layout ",
                         o.layout().text(), " is worth compressing at rank ", p.rank,
                         " (min_rate): use dense");
       return std::make_unique<PowerSGD>(dim, std::move(spec), plan, p, device);
     },
     LayoutUse::Required,
     {"powersgd:rank=2", "powersgd:rank=1,warm=0", "powersgd:rank=1,momentum=0.9,wire=fp16"},
     [](const Options& o) { return !plan_of(o).matrices.empty(); }});

}  // namespace
}  // namespace sketchsgd
