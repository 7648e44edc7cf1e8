#include "numesh/sharding/mesh_context.hpp"

namespace numesh::sharding {

namespace {
const Mesh kEmptyMesh;
thread_local const Mesh* t_current = nullptr;
}  // namespace

MeshScope::MeshScope(Mesh mesh) : mesh_(std::move(mesh)), previous_(t_current) {
  t_current = &mesh_;
}

MeshScope::~MeshScope() { t_current = previous_; }

const Mesh& current_mesh() noexcept { return t_current ? *t_current : kEmptyMesh; }

}  // namespace numesh::sharding
