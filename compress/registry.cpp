#include <sketchsgd/compress/registry.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd {
namespace {

__extension__ typedef unsigned __int128 u128;  // exact products of two 64-bit sizes

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string format_number(double v, bool integer) {
  std::ostringstream os;
  if (integer) {
    os << uint64_t(v);
  } else {
    os.precision(9);
    os << v;
  }
  return os.str();
}

/// A value as a spec writes it: its name for an enumeration, else the number.
std::string format_value(const OptionSpec& o, double v) {
  const double i = v - o.min;
  if (!o.names.empty() && i >= 0 && i < double(o.names.size())) return o.names[size_t(i)];
  return format_number(v, o.integer);
}

std::string describe_options(const CodecEntry& e) {
  std::ostringstream os;
  if (e.options.empty()) return "  (no options)\n";
  for (const auto& o : e.options) {
    os << "  " << o.key << "=";
    if (!o.names.empty()) {
      for (size_t i = 0; i < o.names.size(); ++i) os << (i ? "|" : "") << o.names[i];
    } else {
      os << (o.integer ? "<int>" : "<number>") << " in [" << format_number(o.min, o.integer) << ", "
         << format_number(o.max, o.integer) << "]";
    }
    os << ", default " << format_value(o, o.fallback) << ": " << o.help << "\n";
  }
  return os.str();
}

std::string with_layout(std::string_view spec, const Layout& layout) {
  return std::string(spec) + (spec.find(':') == std::string_view::npos ? ":" : ",") +
         "layout=" + layout.text();
}

}  // namespace

double Options::number(const std::string& key) const {
  auto it = values_.find(key);
  SKETCHSGD_REQUIRE(it != values_.end(), InvalidArgument, "option '", key, "' is not declared");
  return it->second;
}

std::string Options::canonical(const std::string& name,
                               const std::vector<OptionSpec>& specs) const {
  std::string out = name;
  char sep = ':';
  for (const auto& o : specs) {
    out += sep;
    out += o.key + "=" + format_value(o, number(o.key));
    sep = ',';
  }
  if (!layout_.empty()) out += std::string(1, sep) + "layout=" + layout_.text();
  return out;
}

Registry& Registry::instance() {
  static Registry registry;
  return registry;
}

void Registry::add(CodecEntry entry) {
  const std::string name = entry.name;
  SKETCHSGD_REQUIRE(!entries_.count(name), InvalidArgument, "codec '", name, "' registered twice");
  entries_.emplace(name, std::move(entry));
}

const CodecEntry* Registry::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<const CodecEntry*> Registry::entries() const {
  std::vector<const CodecEntry*> out;
  for (const auto& [name, e] : entries_) out.push_back(&e);
  return out;
}

std::string Registry::describe() const {
  std::ostringstream os;
  for (const auto& [name, e] : entries_) {
    os << name << ": " << e.summary << "\n" << describe_options(e);
    if (e.layout != LayoutUse::None)
      os << "  layout=<shapes>: the vector's tensors, e.g. 1024x784+1024 ("
         << (e.layout == LayoutUse::Required ? "required" : "optional") << ")\n";
  }
  return os.str();
}

std::pair<const CodecEntry*, Options> Registry::parse(std::string_view spec) const {
  spec = trim(spec);
  const size_t colon = spec.find(':');
  const std::string_view name = trim(spec.substr(0, colon));
  const CodecEntry* e = find(name);
  if (!e) {
    std::string known;
    for (const auto& [n, entry] : entries_) known += (known.empty() ? "" : ", ") + n;
    detail::raise<InvalidArgument>("unknown codec '", name, "' in spec '", spec,
                                   "'; known: ", known);
  }
  Options opts;
  for (const auto& o : e->options) opts.values_[o.key] = o.fallback;

  std::string_view rest = colon == std::string_view::npos ? "" : spec.substr(colon + 1);
  std::map<std::string, bool, std::less<>> given;
  while (colon != std::string_view::npos) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    const size_t eq = item.find('=');
    SKETCHSGD_REQUIRE(eq != std::string_view::npos, InvalidArgument, "spec '", spec, "': '", item,
                      "' is not key=value; ", name, " accepts:\n", describe_options(*e));
    const std::string key(trim(item.substr(0, eq)));
    const std::string_view text = trim(item.substr(eq + 1));
    if (key == "layout") {
      SKETCHSGD_REQUIRE(e->layout != LayoutUse::None, InvalidArgument, "spec '", spec, "': codec ",
                        name, " does not use a layout");
      SKETCHSGD_REQUIRE(!given.count(key), InvalidArgument, "spec '", spec,
                        "': option 'layout' given twice");
      opts.layout_ = Layout::parse(text);
      given[key] = true;
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
      continue;
    }
    const OptionSpec* o = nullptr;
    for (const auto& cand : e->options)
      if (cand.key == key) o = &cand;
    SKETCHSGD_REQUIRE(o, InvalidArgument, "spec '", spec, "': unknown option '", key, "' for ",
                      name, "; accepted:\n", describe_options(*e));
    SKETCHSGD_REQUIRE(!given.count(key), InvalidArgument, "spec '", spec, "': option '", key,
                      "' given twice");
    SKETCHSGD_REQUIRE(!text.empty(), InvalidArgument, "spec '", spec, "': option '", key,
                      "' has no value");
    double v = 0;
    bool named = false;
    for (size_t i = 0; i < o->names.size(); ++i)
      if (text == o->names[i]) {
        v = o->min + double(i);
        named = true;
      }
    if (!named) {
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      SKETCHSGD_REQUIRE(ec == std::errc() && end == text.data() + text.size() && std::isfinite(v),
                        InvalidArgument, "spec '", spec, "': option '", key, "' = '", text,
                        "' is not ", o->names.empty() ? "a number" : "one of its values", "; ",
                        name, " accepts:\n", describe_options(*e));
    }
    SKETCHSGD_REQUIRE(!o->integer || v == std::floor(v), InvalidArgument, "spec '", spec,
                      "': option '", key, "' must be an integer, got ", text);
    SKETCHSGD_REQUIRE(v >= o->min && v <= o->max, InvalidArgument, "spec '", spec, "': option '",
                      key, "' = ", text, " outside [", format_number(o->min, o->integer), ", ",
                      format_number(o->max, o->integer), "]");
    opts.values_[key] = v;
    given[key] = true;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return {e, std::move(opts)};
}

std::unique_ptr<Compressor> Registry::make(std::string_view spec, uint64_t dim,
                                           const Device& device) const {
  SKETCHSGD_REQUIRE(dim >= 1 && dim <= 0xFFFFFFFFull, InvalidArgument, "codec dim must be in [1, ",
                    "2^32-1], got ", dim);
  auto [e, opts] = parse(spec);
  SKETCHSGD_REQUIRE(opts.layout_.empty() || opts.layout_.size() == dim, InvalidArgument, "spec '",
                    trim(spec), "': the layout holds ", opts.layout_.size(), " values, the vector ",
                    dim);
  return e->build(opts, dim, opts.canonical(e->name, e->options), device);
}

std::string share_spec(std::string_view spec, double share) {
  SKETCHSGD_REQUIRE(share > 0.0 && share <= 1.0, InvalidArgument, "share_spec: share ", share,
                    " is not in (0, 1]");
  auto [e, opts] = Registry::instance().parse(spec);
  for (const auto& o : e->options) {
    double& v = opts.values_[o.key];
    if (!o.budget || v <= 0 || share == 1.0) continue;  // the whole model: the budget as given
    // Half to even, as Python's round(), in granules where the share holds one: a sketch's
    // columns a multiple of 4 keep its encode on the vectorised path (an odd count costs 4-8×).
    const double x = v * share, g = o.granule;
    v = std::clamp(std::max(1.0, x >= g ? std::nearbyint(x / g) * g : std::nearbyint(x)), o.min,
                   o.max);
  }
  return opts.canonical(e->name, e->options);
}

std::vector<std::string> split_spec(std::string_view spec, std::span<const uint64_t> sizes) {
  SKETCHSGD_REQUIRE(!sizes.empty(), InvalidArgument, "split_spec: no parts");
  auto [e, opts] = Registry::instance().parse(spec);
  uint64_t total = 0;
  for (const uint64_t n : sizes) {
    SKETCHSGD_REQUIRE(n > 0, InvalidArgument, "split_spec: a part of size 0");
    total += n;
  }
  const Layout whole = opts.layout_;
  SKETCHSGD_REQUIRE(whole.empty() || whole.size() == total, InvalidArgument,
                    "split_spec: parts of ", total, " values for a layout of ", whole.size());
  std::vector<Options> parts(sizes.size(), opts);
  if (!whole.empty()) {
    size_t t = 0;
    uint64_t end = 0;
    for (size_t p = 0; p < sizes.size(); ++p) {
      end += sizes[p];
      std::vector<std::vector<uint64_t>> shapes;
      while (t < whole.tensors().size() && whole.tensors()[t].offset < end) {
        const auto& tensor = whole.tensors()[t];
        SKETCHSGD_REQUIRE(tensor.offset + tensor.numel <= end, InvalidArgument,
                          "split_spec: a cut at ", end, " falls inside tensor ", t, " [",
                          tensor.offset, ", ", tensor.offset + tensor.numel, ")");
        shapes.push_back(whole.shapes()[t++]);
      }
      parts[p].layout_ = Layout(std::move(shapes));
    }
  }
  // Largest remainder: the parts' budgets add up to the whole's (each at least 1, as a codec
  // needs one), so S shards send what one server's job sends; in granules (share_spec()) where the
  // whole is a number of them, as many as the parts or more.
  for (const auto& o : e->options) {
    const double v = opts.values_.at(o.key);
    if (!o.budget || v <= 0) continue;
    const uint64_t g =
        o.granule > 1 && uint64_t(v) % o.granule == 0 && uint64_t(v) / o.granule >= sizes.size()
            ? o.granule
            : 1;
    const auto budget = static_cast<u128>(uint64_t(v) / g);
    std::vector<uint64_t> share(sizes.size());
    std::vector<std::pair<uint64_t, size_t>> rest;  // (remainder, part)
    uint64_t given = 0;
    for (size_t p = 0; p < sizes.size(); ++p) {
      const u128 x = budget * sizes[p];
      share[p] = uint64_t(x / total);
      rest.emplace_back(uint64_t(x % total), p);
      given += share[p];
    }
    std::stable_sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (size_t i = 0; given < uint64_t(v) / g; ++i, ++given) ++share[rest[i].second];
    for (size_t p = 0; p < sizes.size(); ++p)
      parts[p].values_[o.key] = std::clamp(std::max(1.0, double(share[p] * g)), o.min, o.max);
  }
  std::vector<std::string> out;
  for (const auto& p : parts) out.push_back(p.canonical(e->name, e->options));
  return out;
}

std::unique_ptr<Compressor> make_compressor(std::string_view spec, uint64_t dim,
                                            const Device& device) {
  return Registry::instance().make(spec, dim, device);
}

std::unique_ptr<Compressor> make_compressor(std::string_view spec, const Layout& layout,
                                            const Device& device) {
  SKETCHSGD_REQUIRE(!layout.empty(), InvalidArgument, "make_compressor: empty layout");
  spec = trim(spec);
  SKETCHSGD_REQUIRE(spec.find("layout=") == std::string_view::npos, InvalidArgument, "spec '", spec,
                    "' has a layout already");
  return Registry::instance().make(with_layout(spec, layout), layout.size(), device);
}

bool compresses_any(std::string_view spec, const Layout& layout) {
  SKETCHSGD_REQUIRE(!layout.empty(), InvalidArgument, "compresses_any: empty layout");
  spec = trim(spec);
  SKETCHSGD_REQUIRE(spec.find("layout=") == std::string_view::npos, InvalidArgument, "spec '", spec,
                    "' has a layout already");
  const auto [e, opts] = Registry::instance().parse(spec);
  if (e->layout == LayoutUse::None || !e->compresses) return true;
  return e->compresses(Registry::instance().parse(with_layout(spec, layout)).second);
}

std::string complete_spec(std::string_view spec, const Layout& layout) {
  spec = trim(spec);
  const CodecEntry* e = Registry::instance().find(trim(spec.substr(0, spec.find(':'))));
  if (!e || e->layout != LayoutUse::Required || layout.empty() ||
      spec.find("layout=") != std::string_view::npos)
    return std::string(spec);
  return with_layout(spec, layout);
}

std::vector<CodecExample> example_cases(const Layout& layout) {
  std::vector<CodecExample> out;
  for (const CodecEntry* e : Registry::instance().entries()) {
    SKETCHSGD_REQUIRE(!e->examples.empty(), InvalidArgument, "codec ", e->name,
                      " registers no examples (CodecEntry::examples)");
    for (const CodecExample& x : e->examples) {
      if (e->layout != LayoutUse::Required) out.push_back(x);
      if (e->layout != LayoutUse::None && !layout.empty())
        out.emplace_back(with_layout(x.spec, layout), x.lr, x.train);
    }
  }
  return out;
}

std::vector<std::string> example_specs(const Layout& layout) {
  std::vector<std::string> out;
  for (CodecExample& x : example_cases(layout)) out.push_back(std::move(x.spec));
  return out;
}

}  // namespace sketchsgd
