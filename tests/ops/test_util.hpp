#pragma once

// Shared by the ops tests: seeded random host tensors, and meshes over the runtime tests'
// cached synthetic devices (../runtime/test_devices.hpp: one NUMA node and one thread per
// device, unpinned).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../common/matches_reference.hpp"
#include "../runtime/test_devices.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/moe_config.hpp"
#include "numesh/ops/transformer_config.hpp"
#include "numesh/runtime/device_mesh.hpp"
#include "numesh/runtime/tensor.hpp"
#include "numesh/sharding/partition_spec.hpp"

namespace numesh::ops::testing {

/// A [shape] tensor of normal(0, scale) values from a seeded generator.
inline runtime::HostTensor random_host(std::vector<std::int64_t> shape, std::uint32_t seed,
                                       float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  runtime::HostTensor t = runtime::HostTensor::zeros(std::move(shape));
  for (float& v : t.data) v = normal(rng);
  return t;
}

/// `got` within `max_abs` of `want` everywhere, and of its shape (want is a column-major Eigen
/// matrix of doubles, as the dense references compute).
inline ::testing::AssertionResult close(const RowMatrix& got, const Eigen::MatrixXd& want,
                                        double max_abs) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    return ::testing::AssertionFailure()
           << "shape [" << got.rows() << ", " << got.cols() << "], want [" << want.rows() << ", "
           << want.cols() << "]";
  }
  const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> w = want;
  return numesh::testing::within_abs(
      std::span<const float>(got.data(), static_cast<std::size_t>(got.size())),
      std::span<const double>(w.data(), static_cast<std::size_t>(w.size())), max_abs);
}

/// `n` normal(0, 1) values from a seeded generator.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  return random_host({static_cast<std::int64_t>(n)}, seed, 1.0f).data;
}

/// A rank-2 host tensor seen as a row-major matrix (no copy).
inline RowMatrix matrix(const runtime::HostTensor& t) {
  return Eigen::Map<const RowMatrix>(t.data.data(), t.shape[0], t.shape[1]);
}

/// `n` synthetic devices (cached per process).
inline std::shared_ptr<runtime::DeviceSet> devices(int n) {
  return runtime::testing::synthetic_devices(runtime::testing::nodes(n));
}

/// A mesh shape to run an operator test on.
struct MeshCase {
  std::vector<std::int64_t> dims;
  std::vector<std::string> names;
};

/// The mesh of `c` over exactly as many synthetic devices as it has slots.
inline runtime::DeviceMesh make_mesh(const MeshCase& c) {
  std::int64_t n = 1;
  for (std::int64_t d : c.dims) n *= d;
  return runtime::DeviceMesh::create(devices(static_cast<int>(n)), c.dims, c.names);
}

/// "mesh_dp2_tp4": a mesh case as a test-name suffix or a failure label.
inline std::string mesh_label(const MeshCase& c) {
  std::string n = "mesh";
  for (std::size_t i = 0; i < c.dims.size(); ++i) n += "_" + c.names[i] + std::to_string(c.dims[i]);
  return n;
}

/// mesh_label of a parameterised test's case.
inline std::string mesh_case_name(const ::testing::TestParamInfo<MeshCase>& info) {
  return mesh_label(info.param);
}

using numesh::testing::matches_reference;

/// The routing groups (or any split) a sharded layer makes of `extent` rows over `axes` on the
/// mesh of `c`: the product of the sizes of those axes the mesh has, when it divides `extent`;
/// 1 otherwise (eformer's correction replicates a dim its axes do not divide). Computed from the
/// mesh case for the oracles, never read from the layer under test.
inline std::int64_t expected_groups(const MeshCase& c, const std::vector<std::string>& axes,
                                    std::int64_t extent) {
  std::int64_t n = 1;
  for (const std::string& a : axes) {
    for (std::size_t i = 0; i < c.names.size(); ++i) {
      if (c.names[i] == a) n *= c.dims[i];
    }
  }
  return extent % n == 0 ? n : 1;
}

/// A MoE layer's weights for hidden h, e experts of intermediate f: router [h, e] normal(0,
/// 0.5), gate and up [e, h, f] and down [e, f, h] normal(0, 0.3), fixed seeds.
inline MoeWeights random_moe_weights(std::int64_t h, std::int64_t f, std::int64_t e) {
  MoeWeights w;
  w.router = random_host({h, e}, 21, 0.5f);
  w.gate = random_host({e, h, f}, 22, 0.3f);
  w.up = random_host({e, h, f}, 23, 0.3f);
  w.down = random_host({e, f, h}, 24, 0.3f);
  return w;
}

/// random_moe_weights with Qwen2-MoE's shared expert of intermediate size fs and its gate [H, 1].
inline MoeWeights with_shared_expert(std::int64_t h, std::int64_t f, std::int64_t e,
                                     std::int64_t fs) {
  MoeWeights w = random_moe_weights(h, f, e);
  w.shared_expert.gate = random_host({h, fs}, 27, 0.3f);
  w.shared_expert.up = random_host({h, fs}, 28, 0.3f);
  w.shared_expert.down = random_host({fs, h}, 29, 0.3f);
  w.shared_expert_gate = random_host({h, 1}, 30, 0.5f);
  return w;
}

/// A 2-block dense language-model stack small enough to train or fault node by node: H 32,
/// 4 query and 2 key/value heads of 8 with RoPE, F 64, RMSNorm eps 1e-5.
inline TransformerConfig tiny_lm_config() {
  TransformerConfig c;
  c.hidden = 32;
  c.layers = 2;
  c.attention = AttentionConfig{.num_heads = 4, .num_kv_heads = 2, .head_dim = 8};
  c.attention.rope_theta = 10000.0f;
  c.ffn = 64;
  c.moe_every = 0;
  c.norm_eps = 1e-5f;
  return c;
}

/// The transformer stack's tests' model: hidden 32, block 0 a SwiGLU MLP (F 64), block 1 a MoE
/// of 4 experts (top 2, F 16); heads 4 over 2 kv heads of 8.
inline TransformerConfig small_transformer_config() {
  TransformerConfig c;
  c.hidden = 32;
  c.layers = 2;
  c.attention = AttentionConfig{.num_heads = 4, .num_kv_heads = 2, .head_dim = 8};
  c.ffn = 64;
  c.moe = MoeConfig{.num_experts = 4, .top_k = 2};
  c.moe_ffn = 16;
  c.moe_every = 2;
  return c;
}

/// tiny_lm_config() whose second block is a mixture of experts: Mixtral's top-2 of 4,
/// renormalised, dropless, experts of F 16.
inline TransformerConfig tiny_moe_lm_config() {
  TransformerConfig c = tiny_lm_config();
  c.moe = MoeConfig{.num_experts = 4, .top_k = 2};
  c.moe_ffn = 16;
  c.moe_every = 2;
  return c;
}

/// The spec entry splitting a dim over those of `names` the mesh has: None, a name or a tuple.
inline sharding::AxisRule entry_over(const runtime::DeviceMesh& mesh,
                                     const std::vector<std::string>& names) {
  std::vector<sharding::AxisRule> present;
  for (const std::string& a : names) {
    if (mesh.mesh().has_axis(a)) present.emplace_back(a);
  }
  if (present.empty()) return {};
  return present.size() == 1 ? present.front() : sharding::AxisRule::tuple(present);
}

/// Tokens [from, from + n) of a [B, T, ...] tensor.
inline runtime::HostTensor token_slice(const runtime::HostTensor& x, std::int64_t from,
                                       std::int64_t n) {
  return numesh::ops::slice_tokens(x, from, n);
}

}  // namespace numesh::ops::testing
