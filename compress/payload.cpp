#include "payload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/gpu.hpp>
#include <sketchsgd/core/half.hpp>
#include <sketchsgd/core/hd.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>

namespace sketchsgd::payload {

void write_sparse(ByteWriter& w, std::span<const uint32_t> idx, std::span<const float> val,
                  SparseFormat f) {
  Bytes values;  // 16-bit ones first, so a value that does not fit stops before anything is written
  if (f.values != WireFloat::F32) {
    ByteWriter vw(values);
    write_values(vw, val, f.values, "sparse value");
  }
  w.put(uint32_t(idx.size()));
  if (!f.delta)
    w.put_array(idx);
  else
    kernels::cpu::delta_encode(idx.data(), idx.size(),
                               w.grow(kernels::cpu::delta_bytes(idx.data(), idx.size())));
  if (f.values == WireFloat::F32)
    w.put_array(val);
  else
    w.put_array(std::span<const uint8_t>(values));
}

void write_sparse(const Device& d, Scratch& s, ByteWriter& w, std::span<const uint32_t> idx,
                  std::span<const float> val, SparseFormat f) {
  if (ops::host_memory(d)) return write_sparse(w, idx, val, f);
  if (f.values != WireFloat::F32) {  // checked and converted on the host (no GPU codec asks yet)
    std::vector<uint32_t> hi(idx.size());
    std::vector<float> hv(val.size());
    detail::copy_bytes(hi.data(), idx.data(), idx.size_bytes(), d);
    detail::copy_bytes(hv.data(), val.data(), val.size_bytes(), d);
    return write_sparse(w, hi, hv, f);
  }
  w.put(uint32_t(idx.size()));
  const auto coded =
      f.delta ? ops::delta_encode(d, s, idx)
              : std::span(reinterpret_cast<const uint8_t*>(idx.data()), idx.size_bytes());
  // Both parts into pinned memory (one wait), then into the message: a device-to-pageable copy
  // runs at a fraction of the speed.
  const size_t n = coded.size(), m = val.size_bytes();
  auto* staged = static_cast<uint8_t*>(s.workspace().host(n + m));
  gpu::copy_async(staged, coded.data(), n, d.stream);
  gpu::copy_async(staged + n, val.data(), m, d.stream);
  gpu::synchronize(d.stream);
  std::memcpy(w.grow(n), staged, n);
  std::memcpy(w.grow(m), staged + n, m);
}

Message sparse_update(Header phase, std::span<const uint32_t> idx, std::span<const float> val,
                      SparseFormat f) {
  phase.kind = MessageKind::Update;
  return Message::build(phase, sparse_bytes(idx.size(), f),
                        [&](ByteWriter& w) { write_sparse(w, idx, val, f); });
}

namespace {
std::vector<uint32_t> read_delta_indices(ByteReader& r, uint64_t dim, uint32_t n) {
  std::vector<uint32_t> idx(n);
  uint64_t next = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      SKETCHSGD_REQUIRE(shift < 35, WireError, "sparse index ", i, ": varint longer than 5 bytes");
      const uint8_t b = r.get<uint8_t>();
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) break;
    }
    const uint64_t j = next + v;
    SKETCHSGD_REQUIRE(j < dim, WireError, "index ", j, " out of range for dim ", dim);
    idx[i] = uint32_t(j);
    next = j + 1;
  }
  return idx;
}
}  // namespace

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

Sparse read_sparse(ByteReader& r, uint64_t dim, uint64_t max_count, SparseFormat f) {
  Sparse s;
  if (f.delta) {
    const uint32_t n = r.get<uint32_t>();
    SKETCHSGD_REQUIRE(n <= max_count, WireError, "index list of ", n, " entries exceeds ",
                      max_count);
    SKETCHSGD_REQUIRE(n <= r.left(), WireError, "index list of ", n, " entries in ", r.left(),
                      " bytes");
    s.indices = read_delta_indices(r, dim, n);
  } else {
    s.indices = read_indices(r, dim, max_count);
  }
  s.values = read_values(r, s.indices.size(), f.values, "sparse value");
  return s;
}

Sparse read_sparse_into(ByteReader& r, Scratch& s, uint64_t max_count, std::span<float> step,
                        const Device& device, SparseFormat f) {
  Sparse u = read_sparse(r, step.size(), max_count, f);
  r.expect_end();
  ops::write_sparse(device, s, step, u.indices, u.values);
  return u;
}

Sparse read_sparse_axpy(ByteReader& r, Scratch& s, uint64_t max_count, std::span<float> params,
                        float a, const Device& device, SparseFormat f) {
  Sparse u = read_sparse(r, params.size(), max_count, f);
  r.expect_end();
  ops::add_sparse(device, s, params, u.indices, u.values, a);
  return u;
}

void sort_by_index(std::vector<uint32_t>& idx, std::vector<float>& val) {
  kernels::cpu::sort_pairs(idx.data(), val.data(), idx.size());
}

void merge_by_index(std::vector<uint32_t>& idx, std::vector<float>& val,
                    std::span<const size_t> starts) {
  // (index, value bits) as one key: the order sort_by_index gives, so a sum over equal indices
  // never depends on the order in which the runs (messages) came.
  const size_t n = idx.size();
  std::vector<uint64_t> key(n);
  for (size_t i = 0; i < n; ++i) key[i] = (uint64_t(idx[i]) << 32) | float_bits(val[i]);
  std::vector<size_t> at(starts.begin(), starts.end());
  at.push_back(n);
  while (at.size() > 2) {  // neighbouring runs merged pairwise: log2(runs) passes
    std::vector<size_t> next;
    for (size_t r = 0; r + 1 < at.size(); r += 2) {
      next.push_back(at[r]);
      if (r + 2 < at.size())
        std::inplace_merge(key.begin() + at[r], key.begin() + at[r + 1], key.begin() + at[r + 2]);
    }
    next.push_back(n);
    at.swap(next);
  }
  for (size_t i = 0; i < n; ++i) {
    idx[i] = uint32_t(key[i] >> 32);
    val[i] = bits_float(uint32_t(key[i]));
  }
}

std::vector<float> read_floats(ByteReader& r, uint64_t n, const char* what) {
  auto bytes = r.take<float>(n);
  std::vector<float> out(n);
  if (n) std::memcpy(out.data(), bytes.data(), bytes.size());
  const size_t bad = kernels::cpu::find_nonfinite(out.data(), out.size());
  SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, what, " ", bad, " is not finite");
  return out;
}

namespace {
/// The I8 group of value i (wire.hpp: i8_groups).
uint64_t i8_group(uint64_t i, uint64_t columns) {
  return i / columns / kI8Rows * columns + i % columns;
}

void write_i8(ByteWriter& w, std::span<const float> v, const char* what, uint64_t columns) {
  std::vector<float> scale(i8_groups(v.size(), columns), 0.0f);
  for (size_t i = 0; i < v.size(); ++i) {
    SKETCHSGD_REQUIRE(is_finite(v[i]), NonFiniteError, what, " ", i, " = ", v[i], " is not finite");
    float& s = scale[i8_group(i, columns)];
    s = std::max(s, std::fabs(v[i]));
  }
  for (auto& s : scale) s /= 127.0f;
  std::vector<int8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float s = scale[i8_group(i, columns)];
    q[i] = s > 0.0f ? int8_t(std::clamp(std::nearbyint(v[i] / s), -127.0f, 127.0f)) : int8_t(0);
  }
  w.put_array(std::span<const float>(scale));
  w.put_array(std::span<const int8_t>(q));
}

std::vector<float> read_i8(ByteReader& r, uint64_t n, const char* what, uint64_t columns) {
  const auto scale = read_scales(r, i8_groups(n, columns));
  std::vector<int8_t> q(n);
  r.get_array(std::span<int8_t>(q));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    SKETCHSGD_REQUIRE(q[i] != -128, WireError, what, " ", i,
                      " is -128 (int8 values are within ±127)");
    out[i] = float(q[i]) * scale[i8_group(i, columns)];
    SKETCHSGD_REQUIRE(is_finite(out[i]), WireError, what, " ", i, " is not finite");
  }
  return out;
}
}  // namespace

void write_values(ByteWriter& w, std::span<const float> v, WireFloat f, const char* what,
                  uint64_t columns) {
  if (f == WireFloat::F32) return w.put_array(v);
  if (f == WireFloat::I8) return write_i8(w, v, what, columns);
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

void round_values(std::span<float> v, WireFloat f) {
  SKETCHSGD_ASSERT(f != WireFloat::I8, "round_values: I8 values are rounded by groups");
  if (f == WireFloat::F16)
    for (auto& x : v) x = half_float(half_bits(x));
  else if (f == WireFloat::BF16)
    for (auto& x : v) x = bf16_float(bf16_bits(x));
}

std::vector<float> read_values(ByteReader& r, uint64_t n, WireFloat f, const char* what,
                               uint64_t columns) {
  if (f == WireFloat::F32) return read_floats(r, n, what);
  if (f == WireFloat::I8) return read_i8(r, n, what, columns);
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
