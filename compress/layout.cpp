#include <sketchsgd/compress/layout.hpp>

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
    SKETCHSGD_REQUIRE(*p == 'x' || *p == '+', InvalidArgument, "layout '", text,
                      "': unexpected '", *p, "' at character ", p - text.data());
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

}  // namespace sketchsgd
