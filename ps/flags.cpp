#include <sketchsgd/ps/flags.hpp>

#include <cmath>
#include <cstdio>

namespace sketchsgd::ps {

bool Flags::parse(int argc, char** argv) {
  for (auto& [name, f] : flags_)
    if (!f.env.empty())
      if (const char* v = std::getenv(f.env.c_str())) f.value = v;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    SKETCHSGD_REQUIRE(a.rfind("--", 0) == 0, InvalidArgument, "unexpected argument '", a,
                      "' (see --help)");
    a = a.substr(2);
    std::string value;
    bool has_value = false;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    const auto it = flags_.find(a);
    SKETCHSGD_REQUIRE(it != flags_.end(), InvalidArgument, "unknown flag --", a, " (see --help)");
    if (!has_value) {
      if (it->second.boolean) {
        value = "1";
      } else {
        SKETCHSGD_REQUIRE(i + 1 < argc, InvalidArgument, "flag --", a, " needs a value");
        value = argv[++i];
      }
    }
    it->second.value = value;
    it->second.given = true;
  }
  return true;
}

const Flags::Flag& Flags::get(const std::string& name) const {
  const auto it = flags_.find(name);
  SKETCHSGD_REQUIRE(it != flags_.end(), InvalidArgument, "flag --", name, " was never declared");
  return it->second;
}

uint64_t Flags::u64(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  SKETCHSGD_REQUIRE(!v.empty() && v[0] != '-' && end && *end == '\0' && errno == 0, InvalidArgument,
                    "--", name, " must be a non-negative integer, got '", v, "'");
  return x;
}

uint64_t Flags::u64(const std::string& name, uint64_t lo, uint64_t hi) const {
  const uint64_t v = u64(name);
  SKETCHSGD_REQUIRE(v >= lo && v <= hi, InvalidArgument, "--", name, " must be in [", lo, ", ", hi,
                    "], got ", v);
  return v;
}

double Flags::num(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  SKETCHSGD_REQUIRE(!v.empty() && end && *end == '\0' && std::isfinite(x), InvalidArgument, "--",
                    name, " must be a finite number, got '", v, "'");
  return x;
}

std::string Flags::help() const {
  std::string s = usage_ + "\n\nFlags (environment variable in brackets):\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    std::string head =
        "  --" + name +
        (f.boolean ? "" : "=" + (f.fallback.empty() ? std::string("''") : f.fallback));
    if (!f.env.empty()) head += "  [$" + f.env + "]";
    s += head + "\n      " + f.help + "\n";
  }
  return s;
}

}  // namespace sketchsgd::ps
