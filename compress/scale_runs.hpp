// Where the quantisers (signsgd, terngrad, qsgd) put their scales. Without a layout the vector is
// one run; with one, every tensor is a run of its own, so no scale straddles two tensors (the
// per-layer scaling of the TernGrad and EF-signSGD papers). Each run is cut into chunks of
// `chunk` values (0, or more than the run: the run is one chunk), and its packed signs or codes
// start on a word or byte of their own, so each run is packed and unpacked alone.
#pragma once

#include <cstdint>
#include <vector>

#include <sketchsgd/compress/layout.hpp>

namespace sketchsgd {

class ScaleRuns {
 public:
  struct Run {
    uint64_t offset, numel, chunk;
    uint64_t scale_at;  // its first scale among all
    uint64_t word_at;   // its first 32-sign word among all
    uint64_t code_at;   // its first byte of codes among all
    uint64_t scales() const { return (numel + chunk - 1) / chunk; }
  };

  /// code_bits: bits of a value's code (2: TernGrad).
  ScaleRuns(uint64_t dim, uint64_t chunk, const Layout& layout, uint32_t code_bits = 2)
      : code_bits_(code_bits) {
    if (layout.empty()) {
      add(0, dim, chunk);
      return;
    }
    for (const auto& t : layout.tensors()) add(t.offset, t.numel, chunk);
  }

  const std::vector<Run>& runs() const { return runs_; }
  uint64_t scales() const { return scales_; }
  uint64_t words() const { return words_; }
  uint64_t code_bytes() const { return code_bytes_; }

 private:
  void add(uint64_t offset, uint64_t numel, uint64_t chunk) {
    if (chunk == 0 || chunk > numel) chunk = numel;
    runs_.push_back({offset, numel, chunk, scales_, words_, code_bytes_});
    scales_ += runs_.back().scales();
    words_ += (numel + 31) / 32;
    code_bytes_ += (numel * code_bits_ + 7) / 8;
  }

  uint32_t code_bits_;
  std::vector<Run> runs_;
  uint64_t scales_ = 0, words_ = 0, code_bytes_ = 0;
};

}  // namespace sketchsgd
