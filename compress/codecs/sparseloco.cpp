// sparseloco: SparseLoCo's codec (arXiv 2508.15706), sparsify then quantise. The vector is cut
// into chunks of `chunk` values; each chunk sends its k largest |e| as offsets in the chunk and
// b-bit level codes under one scale (the chunk's largest selected magnitude): a sign bit and
// 2^(b−1) levels scale · m / 2^(b−1), m ≥ 1, rounded to the nearest (a selected value is never
// sent as zero). Per-rank error feedback keeps everything not sent, the rounding included, and
// decays it: e = decay · e + g before each selection (SparseLoCo's 0.95, which stands in for the
// outer momentum of DiLoCo). Gathered: the server sums the decoded sparse vectors and returns
// their mean (at most W · k per chunk), as topk's does. Chunks run over the flat vector (the paper
// chunks each tensor); offsets travel as u16, so a chunk holds at most 65,536 values.
//
// Payload (fixed size): the chunks' scales (f32), then every chunk's offsets (u16, increasing
// within a chunk), then every chunk's codes packed (⌈k_c · b / 8⌉ bytes each).
#include <algorithm>
#include <cmath>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "../codec_info.hpp"
#include "../payload.hpp"
#include "../sparse_codec.hpp"
#include "../sparse_sum.hpp"

namespace sketchsgd {
namespace {

/// How the vector is cut: chunks of `chunk` values (the last may be shorter), k_c = min(k, its
/// length) sent from each.
struct Chunks {
  uint64_t dim, chunk, k;
  uint32_t bits;

  uint64_t count() const { return (dim + chunk - 1) / chunk; }
  uint64_t length(uint64_t c) const { return std::min(chunk, dim - c * chunk); }
  uint64_t sent(uint64_t c) const { return std::min(k, length(c)); }
  uint64_t code_bytes(uint64_t c) const { return (sent(c) * bits + 7) / 8; }
  /// Entries (offsets and codes) over all chunks.
  uint64_t entries() const {
    const uint64_t full = dim / chunk;
    return full * std::min(k, chunk) + (dim % chunk ? std::min(k, dim % chunk) : 0);
  }
  uint64_t all_code_bytes() const {
    const uint64_t full = dim / chunk;
    return full * ((std::min(k, chunk) * bits + 7) / 8) +
           (dim % chunk ? (std::min(k, dim % chunk) * bits + 7) / 8 : 0);
  }
  uint64_t payload_bytes() const { return 4 * count() + 2 * entries() + all_code_bytes(); }
};

/// A message's values at their coordinates (increasing), validated whole before anything is
/// returned: WireError for a truncated or padded payload, a scale that is negative or not
/// finite, an offset past its chunk or not increasing within it, padding bits set.
payload::Sparse decode(ByteReader& r, const Chunks& ch) {
  const auto scales = payload::read_scales(r, ch.count());
  std::vector<uint16_t> offsets(ch.entries());
  r.get_array(std::span<uint16_t>(offsets));
  const auto codes = r.take<uint8_t>(ch.all_code_bytes());
  r.expect_end();
  payload::Sparse s;
  s.indices.resize(offsets.size());
  s.values.resize(offsets.size());
  uint64_t at = 0, code_at = 0;
  for (uint64_t c = 0; c < ch.count(); ++c) {
    const uint64_t n = ch.sent(c), len = ch.length(c);
    for (uint64_t i = 0; i < n; ++i) {
      const uint16_t o = offsets[at + i];
      SKETCHSGD_REQUIRE(o < len && (i == 0 || o > offsets[at + i - 1]), WireError,
                        "sparseloco: chunk ", c, " offset ", i, " = ", o,
                        (o < len ? " does not increase" : " is past the chunk's end"));
      s.indices[at + i] = uint32_t(c * ch.chunk + o);
    }
    const uint64_t used = (n * ch.bits) % 8;  // bits of the chunk's last code byte in use
    SKETCHSGD_REQUIRE(used == 0 || (codes[code_at + ch.code_bytes(c) - 1] >> used) == 0, WireError,
                      "sparseloco: chunk ", c, " sets padding bits after its last code");
    kernels::cpu::level_unpack(codes.data() + code_at, n, scales[c], ch.bits, 1.0f,
                               s.values.data() + at);
    at += n;
    code_at += ch.code_bytes(c);
  }
  return s;
}

class SparseLoCoAggregator final : public Aggregator {
 public:
  SparseLoCoAggregator(const Compressor& c, uint32_t world, Chunks ch, payload::SparseFormat f)
      : Aggregator(c, world), ch_(ch), format_(f) {}

 private:
  void do_add(ByteReader& r, const Header&) override {
    const auto s = decode(r, ch_);
    sum_.add(s.indices, s.values);
  }

  Message reduce(const Header& phase, uint32_t contributors) override {
    const auto [idx, val] = sum_.mean(contributors);
    return payload::sparse_update(phase, idx, val, format_);
  }

  void clear() override { sum_.clear(); }

  Chunks ch_;
  payload::SparseFormat format_;
  SparseSum sum_;
};

class SparseLoCo final : public Compressor, public SparseListCodec {
 public:
  SparseLoCo(uint64_t dim, std::string spec, Chunks ch, float decay, bool ef,
             payload::SparseFormat update, bool sparse_reduce, const Device& device)
      : Compressor(CodecId::SparseLoCo, dim, std::move(spec), device),
        ch_(ch),
        decay_(decay),
        update_(update),
        sparse_reduce_(sparse_reduce),
        fb_(dim, 0.0f, ef, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<SparseLoCoAggregator>(*this, world, ch_, update_);
  }
  uint64_t max_payload(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return ch_.payload_bytes();
    return kind == MessageKind::Update ? payload::sparse_bytes(dim(), update_) : 0;
  }

  bool reduces_sparse() const override { return sparse_reduce_; }
  uint64_t budget() const override { return ch_.entries(); }
  payload::Sparse pairs(std::span<const uint8_t> message) const override {
    decode_header(message, max_payload(MessageKind::Gradient));
    ByteReader r(payload_of(message));
    return decode(r, ch_);
  }
  payload::SparseFormat list_format() const override { return update_; }
  void refund(const payload::Sparse& dropped) override {
    if (fb_.has_error())
      for (size_t i = 0; i < dropped.indices.size(); ++i)
        fb_.error()[dropped.indices[i]] += dropped.values[i];
  }

 private:
  Message do_encode(std::span<const float> g, const Header& h) override {
    if (fb_.has_error() && decay_ != 1.0f) ops::scale(device(), fb_.error(), decay_);
    const auto v = fb_.absorb(g);  // e = decay · e + g (or g itself without error feedback)
    std::vector<float> scales(ch_.count());
    std::vector<uint16_t> offsets(ch_.entries());
    std::vector<uint32_t> idx;  // the chunk's selection, in index order
    std::vector<float> val;
    std::vector<uint8_t> codes(ch_.all_code_bytes());
    std::vector<float> sent(ch_.entries());  // what the codes decode to
    uint64_t at = 0, code_at = 0;
    for (uint64_t c = 0; c < ch_.count(); ++c) {
      const uint64_t n = ch_.sent(c);
      ops::topk(device(), ops_, v.subspan(c * ch_.chunk, ch_.length(c)), n, idx, val,
                kernels::Order::Index);
      float scale = 0.0f;
      for (float x : val) scale = std::max(scale, std::fabs(x));
      scales[c] = scale;
      for (uint64_t i = 0; i < n; ++i) offsets[at + i] = uint16_t(idx[i]);
      kernels::cpu::level_pack(val.data(), n, scale, ch_.bits, codes.data() + code_at,
                               sent.data() + at);
      if (fb_.has_error())  // e −= what was sent at the selected coordinates
        for (uint64_t i = 0; i < n; ++i) fb_.error()[c * ch_.chunk + idx[i]] -= sent[at + i];
      at += n;
      code_at += ch_.code_bytes(c);
    }
    return Message::build(h, ch_.payload_bytes(), [&](ByteWriter& w) {
      w.put_array(std::span<const float>(scales));
      w.put_array(std::span<const uint16_t>(offsets));
      w.put_array(std::span<const uint8_t>(codes));
    });
  }

  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    payload::read_sparse_into(r, ops_, dim(), step, device(), update_);
  }
  void do_apply_step(ByteReader& r, const Header&, std::span<float> params, float lr) override {
    payload::read_sparse_axpy(r, ops_, dim(), params, -lr, device(), update_);
  }
  Feedback* feedback() override { return &fb_; }

  Chunks ch_;
  float decay_;
  payload::SparseFormat update_;
  bool sparse_reduce_;
  Feedback fb_;
};

SKETCHSGD_REGISTER_CODEC(
    kSparseLoCo,
    {"sparseloco",
     "SparseLoCo: top-k of each chunk as b-bit levels under a scale per chunk, decaying error "
     "feedback; server averages the sparse vectors",
     {{"chunk", "values per chunk (at most the vector's length)", 4096, 2, 65536},
      {"k", "values sent per chunk (0: chunk / 64, at least 1)", 0, 0, 65536},
      {"bits", "bits per value, sign included: 2, 4 or 8", 2, 2, 8},
      {"decay", "error feedback's decay before each selection (1: plain error feedback)", 0.95, 0,
       1, false},
      {"ef", "1: error feedback (keep what was not sent, the rounding included)", 1, 0, 1},
      {"index",
       "the update's indices: u32, or delta (gaps as varints)",
       0,
       0,
       1,
       true,
       {"u32", "delta"}},
      {"reduce",
       "among ranks (DDP, DiLoCo, FSDP): gather every rank's list, or sparse (a sparse all-reduce "
       "keeping at most the entries one rank sends, what it drops back to error feedback)",
       0,
       0,
       1,
       true,
       {"gather", "sparse"}}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       const auto bits = uint32_t(o.integer("bits"));
       SKETCHSGD_REQUIRE(bits == 2 || bits == 4 || bits == 8, InvalidArgument,
                         "sparseloco: bits = ", bits, "; use 2, 4 or 8 (codes fill whole bytes)");
       SKETCHSGD_REQUIRE(!device.is_gpu(), InvalidArgument,
                         "sparseloco has no CUDA implementation: build it on the CPU");
       const float decay = float(o.number("decay"));
       SKETCHSGD_REQUIRE(decay > 0.0f, InvalidArgument,
                         "sparseloco: decay = 0 would forget everything not sent; use (0, 1]");
       // A vector shorter than a chunk is one partial chunk, which sends min(k, its length) as a
       // last chunk does: k is checked against the chunk asked for, so that a small unit (a
       // module's shard, an FSDP chunk's piece of a matrix) takes the same spec as a large one.
       const uint64_t asked = o.integer("chunk");
       const uint64_t chunk = std::min<uint64_t>(asked, dim);
       uint64_t k = o.integer("k");
       if (k == 0) k = std::max<uint64_t>(1, asked / 64);
       SKETCHSGD_REQUIRE(k <= asked, InvalidArgument, "sparseloco: k = ", k,
                         " exceeds the chunk of ", asked, " values");
       return std::make_unique<SparseLoCo>(
           dim, std::move(spec), Chunks{dim, chunk, k, bits}, decay, o.flag("ef"),
           payload::SparseFormat{o.flag("index"), WireFloat::F32}, o.flag("reduce"), device);
     },
     LayoutUse::None,
     {"sparseloco:chunk=256,k=16", "sparseloco:chunk=64,k=8,bits=4,decay=1,index=delta",
      "sparseloco:chunk=256,k=16,index=delta,reduce=sparse"}});

}  // namespace
}  // namespace sketchsgd
