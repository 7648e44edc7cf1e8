#pragma once

// The PartitionAxis options shared by `numesh resolve`, `run`, `op` and `generate`: --paxis-json
// FILE and repeatable --set field=value; and the line that shows the axes a model resolved.

#include <string>
#include <vector>

#include "numesh/ops/lowering/model_axes.hpp"
#include "numesh/sharding/partition_axis.hpp"

namespace numesh::tools {

/// The PartitionAxis from a JSON file of fields (empty path: none) with `sets` ("field=value";
/// value a name, None, or (a,b): parsers.hpp's parse_field_set) merged over them before
/// dependent fields are derived.
/// Throws: ValueError naming the file or the --set text when either is malformed; what
/// PartitionAxis::from_json throws for bad fields.
sharding::PartitionAxis build_paxis(const std::string& paxis_json,
                                    const std::vector<std::string>& sets);

/// The axes a model is laid out by, one line: "batch (dp, fsdp), sequence sp, heads tp, mlp tp,
/// experts ep, expert ffn tp" ("-" for an axis not used).
std::string model_axes_text(const ops::ModelAxes& axes);

}  // namespace numesh::tools
