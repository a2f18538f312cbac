#include <sketchsgd/ps/shards.hpp>

#include <cstdlib>
#include <sstream>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {
namespace {

__extension__ typedef unsigned __int128 u128;  // exact products of two 64-bit sizes

/// Where each shard ends: even cuts, or the tensor ends nearest to them.
std::vector<uint64_t> cuts(const Layout& layout, uint64_t dim, uint32_t count) {
  std::vector<uint64_t> ends;
  auto even = [&](uint32_t i) { return uint64_t(u128(dim) * i / count); };
  if (layout.empty()) {
    for (uint32_t i = 1; i <= count; ++i) ends.push_back(even(i));
    return ends;
  }
  const auto& t = layout.tensors();
  SKETCHSGD_REQUIRE(t.size() >= count, InvalidArgument, "a layout of ", t.size(), " tensor",
                    t.size() == 1 ? "" : "s", " cannot be cut into ", count,
                    " shards (each holds whole tensors)");
  size_t last = 0;  // tensors [0, last) are placed
  for (uint32_t i = 1; i < count; ++i) {
    // The shard ends after tensor j − 1 for some j in [last + 1, T − (S − i)]: leaves one
    // tensor at least for each shard after it.
    const uint64_t target = even(i);
    size_t best = last + 1;
    auto gap = [&](size_t j) {
      const uint64_t e = t[j - 1].offset + t[j - 1].numel;
      return e > target ? e - target : target - e;
    };
    for (size_t j = last + 1; j <= t.size() - (count - i); ++j)
      if (gap(j) < gap(best)) best = j;
    ends.push_back(t[best - 1].offset + t[best - 1].numel);
    last = best;
  }
  ends.push_back(dim);
  return ends;
}

/// What a shard of tensors the codec would all send whole runs: dense, with the spec's worker
/// momentum and wire format where it has them (as the DDP hook sends such tensors).
std::string whole_spec(std::string_view spec) {
  const auto [e, o] = Registry::instance().parse(spec);
  std::ostringstream dense;
  dense.precision(9);
  dense << "dense";
  char sep = ':';
  for (const auto& opt : e->options)
    if (opt.key == "momentum" || opt.key == "wire") {
      dense << sep << opt.key << '=' << o.number(opt.key);  // wire: its value's number
      sep = ',';
    }
  return share_spec(dense.str());
}

}  // namespace

std::vector<ShardPlan> plan_shards(std::string_view spec, uint64_t dim, uint32_t count) {
  SKETCHSGD_REQUIRE(count >= 1, InvalidArgument, "shards: S must be ≥ 1");
  SKETCHSGD_REQUIRE(count <= dim, InvalidArgument, "shards: ", count, " shards for ", dim,
                    " parameters");
  const Layout layout = Registry::instance().parse(spec).second.layout();
  SKETCHSGD_REQUIRE(layout.empty() || layout.size() == dim, InvalidArgument, "shards: spec '", spec,
                    "' has a layout of ", layout.size(), " values, the model has ", dim);
  const std::vector<uint64_t> ends = cuts(layout, dim, count);
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < ends.size(); ++i) sizes.push_back(ends[i] - (i ? ends[i - 1] : 0));
  std::vector<std::string> specs = split_spec(spec, sizes);
  for (size_t i = 0; i < specs.size(); ++i) {
    try {
      (void)make_compressor(specs[i], sizes[i]);
    } catch (const InvalidArgument&) {
      if (layout.empty()) throw;
      specs[i] = whole_spec(spec);  // e.g. PowerSGD on a shard of biases only
    }
  }
  std::vector<ShardPlan> plan;
  for (uint32_t i = 0; i < count; ++i)
    plan.push_back({ShardId{i, count, ends[i] - sizes[i], dim}, sizes[i], specs[i]});
  return plan;
}

std::vector<std::string> split_endpoints(std::string_view list, char separator) {
  std::vector<std::string> out;
  for (;;) {
    const size_t comma = list.find(separator);
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    SKETCHSGD_REQUIRE(!item.empty(), InvalidArgument, "endpoint list '", list,
                      "' has an empty item");
    out.emplace_back(item);
    if (comma == std::string_view::npos) return out;
    list.remove_prefix(comma + 1);
  }
}

}  // namespace sketchsgd::ps
