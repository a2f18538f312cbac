// The flags that describe a parameter-server job, in one table that every program starting a
// server declares and reads them from (sketchsgd-server, sketchsgd-train): one name, help text,
// environment variable, range check and meaning each, so the programs cannot drift apart.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/server/job_config.hpp>

namespace sketchsgd::ps {

/// Every flag of the table, in the order --help lists them.
std::vector<std::string> job_flag_names();

/// The table's flags a program declares, and their reading into a JobConfig.
class JobFlags {
 public:
  /// Declares the table's flags `names` on f, each with the table's default unless `defaults`
  /// gives this program's. InvalidArgument for a name the table does not hold.
  void add(Flags& f, const std::vector<std::string>& names,
           const std::map<std::string, std::string>& defaults = {});
  /// Reads into cfg each flag declared by add(), checked (InvalidArgument naming the flag): a
  /// program sets what it knows otherwise (its world, its model's dim and codec) in cfg first.
  /// With --shards > 1 and a dim known, cfg's dim and spec, the whole model's, become the
  /// shard's (plan_shards). --mode async leaves no round policy (Policy::Wait).
  void read(const Flags& f, JobConfig& cfg) const;

 private:
  std::set<std::string> names_;
};

}  // namespace sketchsgd::ps
