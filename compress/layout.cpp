#include <sketchsgd/compress/layout.hpp>

#include <algorithm>
#include <charconv>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd {

Layout::Layout(std::vector<std::vector<uint64_t>> shapes) : shapes_(std::move(shapes)) {
  for (size_t t = 0; t < shapes_.size(); ++t) {
    const auto& s = shapes_[t];
    SKETCHSGD_REQUIRE(!s.empty(), InvalidArgument, "layout: tensor ", t, " has no dimensions");
    uint64_t numel = 1;
    for (uint64_t d : s) {
      SKETCHSGD_REQUIRE(d >= 1 && d <= 0xFFFFFFFFull, InvalidArgument, "layout: tensor ", t,
                        " has a dimension of ", d, " (must be in [1, 2^32-1])");
      numel *= d;
      SKETCHSGD_REQUIRE(numel <= 0xFFFFFFFFull, InvalidArgument, "layout: tensor ", t,
                        " holds more than 2^32-1 values");
    }
    tensors_.push_back({size_, numel, s[0], numel / s[0], s.size()});
    size_ += numel;
    SKETCHSGD_REQUIRE(size_ <= 0xFFFFFFFFull, InvalidArgument,
                      "layout: the tensors hold more than 2^32-1 values");
  }
}

Layout Layout::parse(std::string_view text) {
  std::vector<std::vector<uint64_t>> shapes(1);
  const char* p = text.data();
  const char* end = p + text.size();
  SKETCHSGD_REQUIRE(p != end, InvalidArgument, "layout: empty");
  while (true) {
    uint64_t d = 0;
    const auto [next, ec] = std::from_chars(p, end, d);
    SKETCHSGD_REQUIRE(ec == std::errc() && next != p, InvalidArgument, "layout '", text,
                      "': expected a dimension at character ", p - text.data(),
                      " (tensors joined by '+', dimensions by 'x', e.g. 1024x784+1024)");
    shapes.back().push_back(d);
    p = next;
    if (p == end) break;
    SKETCHSGD_REQUIRE(*p == 'x' || *p == '+', InvalidArgument, "layout '", text, "': unexpected '",
                      *p, "' at character ", p - text.data());
    if (*p == '+') shapes.emplace_back();
    ++p;
  }
  return Layout(std::move(shapes));
}

std::string Layout::text() const {
  std::string out;
  for (size_t t = 0; t < shapes_.size(); ++t) {
    if (t) out += '+';
    for (size_t i = 0; i < shapes_[t].size(); ++i) {
      if (i) out += 'x';
      out += std::to_string(shapes_[t][i]);
    }
  }
  return out;
}

Layout::Split Layout::partition(const std::function<bool(const Tensor&)>& sent_whole) const {
  Split s;
  for (const auto& t : tensors_) {
    const bool whole = sent_whole(t);
    (whole ? s.whole : s.kept).push_back(t);
    (whole ? s.whole_size : s.kept_size) += t.numel;
  }
  return s;
}

std::vector<Layout::Run> Layout::merge(std::span<const Run> runs) {
  std::vector<Run> out;
  for (const auto& r : runs) {
    if (!out.empty() && out.back().offset + out.back().numel == r.offset)
      out.back().numel += r.numel;
    else
      out.push_back(r);
  }
  return out;
}

std::vector<Layout::Run> Layout::Split::runs(const std::vector<Tensor>& side) {
  std::vector<Run> r;
  for (const auto& t : side) r.push_back({t.offset, t.numel});
  return merge(r);
}

std::vector<uint64_t> Layout::Split::shares(uint64_t k) const {
  k = std::min(k, kept_size);
  std::vector<uint64_t> out(kept.size(), 0);
  std::vector<std::pair<double, size_t>> rest;
  uint64_t given = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    const double exact = double(k) * double(kept[i].numel) / double(kept_size);
    out[i] = std::min<uint64_t>(uint64_t(exact), kept[i].numel);
    given += out[i];
    rest.push_back({exact - double(out[i]), i});
  }
  // Stable: equal remainders go to the earlier tensor, whatever the sort's implementation.
  std::stable_sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < k && i < rest.size(); ++i)
    if (out[rest[i].second] < kept[rest[i].second].numel) {
      ++out[rest[i].second];
      ++given;
    }
  return out;
}

}  // namespace sketchsgd
