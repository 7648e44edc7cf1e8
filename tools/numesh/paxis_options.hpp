#pragma once

// The PartitionAxis options shared by `numesh resolve` and `numesh run`: --paxis-json FILE and
// repeatable --set field=value.

#include <string>
#include <vector>

#include "numesh/sharding/partition_axis.hpp"

namespace numesh::tools {

/// The PartitionAxis from a JSON file of fields (empty path: none) with `sets` ("field=value";
/// value a name, None, or (a,b): parsers.hpp's parse_field_set) merged over them before
/// dependent fields are derived.
/// Throws: ValueError naming the file or the --set text when either is malformed; what
/// PartitionAxis::from_json throws for bad fields.
sharding::PartitionAxis build_paxis(const std::string& paxis_json, const std::vector<std::string>& sets);

}  // namespace numesh::tools
