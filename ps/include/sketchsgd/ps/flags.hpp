// Command-line flags with environment-variable fallbacks (as distributed launchers do):
// --name=value or --name value, else $ENV, else the default. --help prints every flag.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {

/// Exit status of a worker program whose server had already finished its job (JobFinished), apart
/// from 0 (done) and 2 (bad flags or another error).
inline constexpr int kExitJobFinished = 3;
/// A server whose backup took over (replicated shards) exits with this status.
inline constexpr int kExitDeposed = 4;

class Flags {
 public:
  explicit Flags(std::string usage) : usage_(std::move(usage)) {}

  /// Declares a flag; env may be empty. A bool flag is given as --name (or --name=0/1).
  void add(const std::string& name, const std::string& fallback, const std::string& help,
           const std::string& env = "", bool boolean = false) {
    order_.push_back(name);
    flags_[name] = Flag{fallback, help, env, boolean, false, fallback};
  }

  /// Returns false when --help was asked (usage printed). Throws InvalidArgument on unknown flags.
  bool parse(int argc, char** argv);

  const std::string& str(const std::string& name) const { return get(name).value; }
  uint64_t u64(const std::string& name) const;
  /// u64 in [lo, hi]: none is cut to a narrower type unseen; the error names the flag.
  uint64_t u64(const std::string& name, uint64_t lo, uint64_t hi) const;
  double num(const std::string& name) const;
  bool on(const std::string& name) const { return str(name) == "1" || str(name) == "true"; }
  std::string help() const;

 private:
  struct Flag {
    std::string fallback, help, env;
    bool boolean;
    bool given;
    std::string value;
  };
  const Flag& get(const std::string& name) const;

  std::string usage_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
};

}  // namespace sketchsgd::ps
