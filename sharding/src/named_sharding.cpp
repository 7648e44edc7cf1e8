#include "numesh/sharding/named_sharding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "numesh/core/error.hpp"

namespace numesh::sharding {

namespace {

// str() of a spec member as Python prints it in JAX's messages: names bare, None, ints.
std::string member_str(const AxisRule& r) { return r.is_name() ? r.name() : r.repr(); }

// The members of an entry as JAX iterates them: a tuple's members, else the entry itself.
std::vector<AxisRule> entry_members(const AxisRule& entry) {
  if (entry.is_tuple()) return entry.members();
  return {entry};
}

}  // namespace

void check_partition_spec(const Mesh& mesh, const PartitionSpec& spec) {
  // 1. Duplicates, counted over every member of every entry (None and UNCONSTRAINED entries
  //    skipped), reported sorted and backticked.
  std::map<std::string, int> counts;
  for (const AxisRule& entry : spec) {
    if (entry.is_none() || entry.is_unconstrained()) continue;
    for (const AxisRule& m : entry_members(entry)) {
      if (m.is_none()) continue;
      ++counts[member_str(m)];
    }
  }
  std::vector<std::string> dups;
  for (const auto& [name, n] : counts) {
    if (n > 1) dups.push_back(fmt::format("`{}`", name));
  }
  if (!dups.empty()) {
    throw DuplicateSpecError(fmt::format(
        "A single NamedSharding spec specification can map every mesh axis to at most one "
        "positional dimension, but {} has duplicate entries for {}",
        spec.repr(), fmt::join(dups, ", ")));
  }
  // 2. Every member must name a mesh axis.
  for (const AxisRule& entry : spec) {
    if (entry.is_none() || entry.is_unconstrained()) continue;
    for (const AxisRule& m : entry_members(entry)) {
      if (m.is_name() && mesh.has_axis(m.name())) continue;
      throw ValueError(fmt::format("Resource axis: {} of {} is not found in mesh: {}.",
                                   member_str(m), spec.repr(), mesh.names_repr()));
    }
  }
}

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec)
    : mesh_(std::move(mesh)), spec_(std::move(spec)) {
  check_partition_spec(mesh_, spec_);
}

}  // namespace numesh::sharding
