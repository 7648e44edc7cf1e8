// numesh_consumer: a tiny program outside numesh's tree. It binds a spec to a mesh and prints
// one line that scripts/test.sh checks:
//
//   numesh_consumer (find_package): P('dp', None, 'tp') on Mesh('dp': 2, 'tp': 4) ok

#include <cstdio>
#include <exception>

#include "numesh/core/error.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/named_sharding.hpp"
#include "numesh/sharding/partition_spec.hpp"

int main() {
  namespace sh = numesh::sharding;
  try {
    sh::Mesh mesh({"dp", "tp"}, sh::resolve_mesh_dims({2, -1}, 8));
    sh::NamedSharding sharding(mesh, sh::PartitionSpec{"dp", nullptr, "tp"});
    std::printf("numesh_consumer (%s): %s on %s ok\n", NUMESH_CONSUMER_MODE,
                sharding.spec().repr().c_str(), sharding.mesh().repr().c_str());
    return 0;
  } catch (const numesh::Error& e) {
    std::fprintf(stderr, "numesh_consumer: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "numesh_consumer: unexpected error: %s\n", e.what());
    return 1;
  }
}
