// resolve_spec: the sharding layer's value types, the way an eformer user meets them.
//
// Resolves the semantic axes of a [batch, sequence, embed] activation with a PartitionManager;
// builds a 2 x 4 mesh the way eformer's create_mesh does (`-1` takes the remaining devices);
// binds a PartitionSpec for that activation to it and prints each device's shard extent; and
// shows the error a spec naming an unknown mesh axis raises.
//
//   build/release/examples/resolve_spec
//
// Links only numesh::numesh, like an external user. The block between the [example] markers is
// copied verbatim into README.md; scripts/test.sh checks that the two agree.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/mesh_context.hpp"
#include "numesh/sharding/named_sharding.hpp"
#include "numesh/sharding/partition_axis.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/semantic_axis.hpp"

namespace sh = numesh::sharding;

int main() {
  try {
    // [example]
    // Semantic axes resolve to mesh axes through a PartitionAxis, as in eformer's
    // PartitionManager (default fields: batch on (fsdp, dp), sequence on sp, embed on tp).
    sh::PartitionManager manager(sh::PartitionAxis{});
    sh::PartitionSpec resolved = manager.resolve(
        {sh::tokens::kBatch, sh::tokens::kQueryLength, sh::tokens::kEmbed}, sh::Mode::kTrain);
    fmt::print("resolved: {}\n", resolved);  // P(('fsdp', 'dp'), 'sp', 'tp')

    // 8 devices laid out as (dp, tp); -1 means "the rest", as in eformer's create_mesh.
    sh::Mesh mesh({"dp", "tp"}, sh::resolve_mesh_dims({2, -1}, 8));  // Mesh('dp': 2, 'tp': 4)

    // [batch, sequence, embed]: batch over dp, sequence replicated, embed over tp.
    sh::PartitionSpec spec{"dp", nullptr, "tp"};  // P('dp', None, 'tp')
    // Checked as JAX's NamedSharding(mesh, spec) is: every axis in the mesh, none twice.
    sh::NamedSharding sharding(mesh, spec);

    // Per-device extent of an (8, 128, 4096) array: each dim divided by its mesh axes.
    const std::vector<std::int64_t> shape{8, 128, 4096};
    std::vector<std::int64_t> local = shape;
    for (std::size_t d = 0; d < spec.size(); ++d) {
      for (const auto& axis : spec.entry_names(d)) local[d] /= mesh.axis_size(axis);
    }
    fmt::print("{} on {}: local shard {}\n", sharding.spec(), sharding.mesh().repr(), local);

    // The same text parses (docs/sharding.md has the grammar).
    fmt::print("parsed: {}\n", sh::PartitionSpec::parse("P(('dp', 'tp'), None)"));

    // Specs are checked against the mesh; errors derive from numesh::Error.
    try {
      sh::NamedSharding bad(mesh, sh::PartitionSpec{"model"});
    } catch (const numesh::ValueError& e) {
      fmt::print("error: {}\n", e.what());
    }
    // [example]

    // A MeshScope makes a mesh current for this thread, as eformer's `with mesh:` does.
    {
      sh::MeshScope scope(mesh);
      fmt::print("current mesh inside scope: {}\n", sh::current_mesh().repr());
    }
    fmt::print("current mesh after scope: {} (empty: {})\n", sh::current_mesh().repr(),
               sh::current_mesh().empty());
    return 0;
  } catch (const numesh::Error& e) {
    fmt::print(stderr, "resolve_spec: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "resolve_spec: unexpected error: {}\n", e.what());
    return 1;
  }
}
