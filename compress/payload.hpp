// Payload pieces shared by several codecs: sparse (index, value) lists, float arrays, checks.
// Readers validate everything (counts, ordering, ranges, finiteness) and throw WireError.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <sketchsgd/compress/sparse_reduce.hpp>
#include <sketchsgd/compress/wire.hpp>
#include <sketchsgd/core/bytes.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/kernels/ops.hpp>

namespace sketchsgd::payload {

/// Sparse vector with strictly increasing indices.
using Sparse = SparseList;

/// How a sparse list travels: indices as u32 or delta-coded (the first index, then each gap − 1,
/// as LEB128 varints: about one byte per index when k is 1 % of d), values in a WireFloat.
struct SparseFormat {
  bool delta = false;
  WireFloat values = WireFloat::F32;
};

/// Writes count, indices, values. Indices must be strictly increasing. NonFiniteError (before
/// anything is written) when a value does not fit a 16-bit format.
void write_sparse(ByteWriter& w, std::span<const uint32_t> idx, std::span<const float> val,
                  SparseFormat f = {});
/// The same with the lists in d's memory: on a GPU the indices are delta-coded there and each
/// part comes to the host once, straight into the message.
void write_sparse(const Device& d, Scratch& s, ByteWriter& w, std::span<const uint32_t> idx,
                  std::span<const float> val, SparseFormat f = {});
/// The phase's Update message carrying a sparse list (indices strictly increasing).
Message sparse_update(Header phase, std::span<const uint32_t> idx, std::span<const float> val,
                      SparseFormat f);
/// Reads a sparse list with count ≤ max_count, indices strictly increasing and < dim (a varint
/// longer than 5 bytes or past 2^32 is refused), values finite.
Sparse read_sparse(ByteReader& r, uint64_t dim, uint64_t max_count, SparseFormat f = {});
/// Reads a sparse Update (count ≤ max_count) and writes it densely into step: zeros elsewhere.
/// Validated completely before step is written.
Sparse read_sparse_into(ByteReader& r, Scratch& s, uint64_t max_count, std::span<float> step,
                        const Device& device, SparseFormat f = {});
/// Reads a sparse Update (count ≤ max_count, then the end) and does params += a · values there.
/// Validated completely before params is written.
Sparse read_sparse_axpy(ByteReader& r, Scratch& s, uint64_t max_count, std::span<float> params,
                        float a, const Device& device, SparseFormat f = {});
/// Reorders (idx, val) pairs by index, equal indices by the value's bits.
void sort_by_index(std::vector<uint32_t>& idx, std::vector<float>& val);
/// The same order for pairs made of runs that each increase strictly in index (messages that
/// read_sparse took; a run starts at each of starts): merged in O(n log runs).
void merge_by_index(std::vector<uint32_t>& idx, std::vector<float>& val,
                    std::span<const size_t> starts);

/// Reads n floats and checks they are finite.
std::vector<float> read_floats(ByteReader& r, uint64_t n, const char* what);
/// Writes values in a wire format (I8: in rows of `columns`, its scales their own);
/// NonFiniteError (naming `what`) when one does not fit it (beyond fp16's range, or not finite
/// for I8), before anything is written.
void write_values(ByteWriter& w, std::span<const float> v, WireFloat f, const char* what,
                  uint64_t columns = 1);
/// Rounds values in place to what a 32- or 16-bit wire format carries (identity for fp32).
void round_values(std::span<float> v, WireFloat f);
/// Reads n values of a wire format as floats and checks they are finite (I8: its scales finite
/// and ≥ 0, its integers within ±127).
std::vector<float> read_values(ByteReader& r, uint64_t n, WireFloat f, const char* what,
                               uint64_t columns = 1);
/// Reads n floats that must be finite and ≥ 0 (scales).
std::vector<float> read_scales(ByteReader& r, uint64_t n);

/// The largest payload of a sparse list of count entries.
inline uint64_t sparse_bytes(uint64_t count, SparseFormat f = {}) {
  return 4 + count * ((f.delta ? 5 : 4) + wire_bytes(f.values));
}

}  // namespace sketchsgd::payload

namespace sketchsgd::payload {
/// Reads count + strictly increasing indices < dim, count ≤ max_count.
std::vector<uint32_t> read_indices(ByteReader& r, uint64_t dim, uint64_t max_count);
}  // namespace sketchsgd::payload
