#include "payload.hpp"

#include <algorithm>
#include <numeric>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/half.hpp>
#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "ops.hpp"

namespace sketchsgd::payload {

void write_sparse(ByteWriter& w, std::span<const uint32_t> idx, std::span<const float> val) {
  w.put(uint32_t(idx.size()));
  w.put_array(idx);
  w.put_array(val);
}

std::vector<uint32_t> read_indices(ByteReader& r, uint64_t dim, uint64_t max_count) {
  const uint32_t n = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(n <= max_count, WireError, "index list of ", n, " entries exceeds ", max_count);
  std::vector<uint32_t> idx(n);
  r.get_array(std::span<uint32_t>(idx));
  for (uint32_t i = 0; i < n; ++i) {
    SKETCHSGD_REQUIRE(idx[i] < dim, WireError, "index ", idx[i], " out of range for dim ", dim);
    SKETCHSGD_REQUIRE(i == 0 || idx[i] > idx[i - 1], WireError,
                      "indices not strictly increasing at entry ", i);
  }
  return idx;
}

Sparse read_sparse(ByteReader& r, uint64_t dim, uint64_t max_count) {
  Sparse s;
  s.indices = read_indices(r, dim, max_count);
  s.values = read_floats(r, s.indices.size(), "sparse value");
  return s;
}

Sparse read_sparse_into(ByteReader& r, Scratch& s, uint64_t max_count, std::span<float> step,
                        const Device& device) {
  Sparse u = read_sparse(r, step.size(), max_count);
  r.expect_end();
  ops::write_sparse(device, s, step, u.indices, u.values);
  return u;
}

Sparse read_sparse_axpy(ByteReader& r, Scratch& s, uint64_t max_count, std::span<float> params,
                        float a, const Device& device) {
  Sparse u = read_sparse(r, params.size(), max_count);
  r.expect_end();
  ops::add_sparse(device, s, params, u.indices, u.values, a);
  return u;
}

void sort_by_index(std::vector<uint32_t>& idx, std::vector<float>& val) {
  kernels::cpu::sort_pairs(idx.data(), val.data(), idx.size());
}

std::vector<float> read_floats(ByteReader& r, uint64_t n, const char* what) {
  auto bytes = r.take<float>(n);
  std::vector<float> out(n);
  if (n) std::memcpy(out.data(), bytes.data(), bytes.size());
  const size_t bad = kernels::cpu::find_nonfinite(out.data(), out.size());
  SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, what, " ", bad, " is not finite");
  return out;
}

void write_values(ByteWriter& w, std::span<const float> v, WireFloat f, const char* what) {
  if (f == WireFloat::F32) return w.put_array(v);
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = f == WireFloat::F16 ? half_bits(v[i]) : bf16_bits(v[i]);
    SKETCHSGD_REQUIRE((out[i] & 0x7FFFu) < (f == WireFloat::F16 ? 0x7C00u : 0x7F80u),
                      NonFiniteError, what, " ", i, " = ", v[i], " does not fit ",
                      f == WireFloat::F16 ? "fp16 (|x| < 65520)" : "bf16",
                      ": use a wider wire format");
  }
  w.put_array(std::span<const uint16_t>(out));
}

std::vector<float> read_values(ByteReader& r, uint64_t n, WireFloat f, const char* what) {
  if (f == WireFloat::F32) return read_floats(r, n, what);
  std::vector<uint16_t> in(n);
  r.get_array(std::span<uint16_t>(in));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = f == WireFloat::F16 ? half_float(in[i]) : bf16_float(in[i]);
    SKETCHSGD_REQUIRE(is_finite(out[i]), WireError, what, " ", i, " is not finite");
  }
  return out;
}

std::vector<float> read_scales(ByteReader& r, uint64_t n) {
  auto out = read_floats(r, n, "scale");
  for (size_t i = 0; i < out.size(); ++i)
    SKETCHSGD_REQUIRE(out[i] >= 0.0f, WireError, "scale ", i, " is negative");
  return out;
}

}  // namespace sketchsgd::payload
