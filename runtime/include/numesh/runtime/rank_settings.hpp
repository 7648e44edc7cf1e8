#pragma once

// Settings that every rank of a run must share (the model, the mesh, the dtype...): compared
// over the transport at start-up, so that ranks launched with different arguments stop at once
// with the differences named, instead of building different graphs and waiting on each other
// forever.

#include <string>
#include <utility>
#include <vector>

#include "numesh/runtime/transport.hpp"

namespace numesh::runtime {

/// A setting by name ("--dims") and value as text ("1,1,2").
using RankSetting = std::pair<std::string, std::string>;

/// Compares `settings` over every rank of `transport` (each rank's whole list is all-gathered:
/// settings are a few hundred bytes). Returns when every rank gave the same list. Collective.
/// Throws: ValueError on every rank, with the same message, naming each setting whose value
/// differs (or that some ranks lack) and each rank's value, e.g. "the ranks were started with
/// different settings: --dims: rank 0 '1,1,2', rank 1 '1,1,4'"; what all_gather throws.
void check_same_on_every_rank(Transport& transport, const std::vector<RankSetting>& settings);

}  // namespace numesh::runtime
