#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/mesh.hpp"
#include "numesh/sharding/partition_manager.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/presets.hpp"
#include "numesh/sharding/semantic_axis.hpp"

// EasyDeL's sharding rules on top of eformer (EasyDeL commit 090a03b; SPEC sections 12-13):
// attention specs (operations/_operation_meta.py), MoE expert specs and the expert mesh
// (layers/moe/_communication_utils.py, infra/base_config.py), kernel helpers
// (operations/_operation_impl.py) and parameter-spec sanitising (layers/_sharding.py,
// infra/utils.py, infra/base_module.py). Every function is pure and matches EasyDeL case for
// case (tests/data/eformer/easydel_*.json), quirks included; docs/sharding.md explains them.
namespace numesh::sharding::easydel {

/// The partition specs of every attention tensor (EasyDeL's AttnShardingRules NamedTuple).
/// `output` is always the query spec.
struct AttnShardingRules {
  PartitionSpec query3d;
  PartitionSpec query;
  PartitionSpec key;
  PartitionSpec value;
  PartitionSpec bias;
  PartitionSpec mask;
  PartitionSpec output;
  PartitionSpec q_segment_ids;
  PartitionSpec kv_segment_ids;
  /// Present only when a softmax_aux rank was given.
  std::optional<PartitionSpec> softmax_aux;
  friend bool operator==(const AttnShardingRules&, const AttnShardingRules&) = default;
};

/// EasyDeL's OperationMetadata.get_shardings: resolves every attention tensor's semantic axes
/// with `pm` in `mode`.
///   bthd: query = [BATCH, QUERY_LENGTH, HEAD, HEAD_DIM], key = value = [BATCH, KV_LENGTH, h, hd]
///   bhtd: query = [BATCH, HEAD, QUERY_LENGTH, HEAD_DIM], key = value = [BATCH, h, KV_LENGTH, hd]
///   with h, hd = HEAD, HEAD_DIM if `qkv_mni_sharding` else KV_HEAD, KV_HEAD_DIM; and for both
///   segment ids [BATCH, QUERY_LENGTH] / [BATCH, KV_LENGTH], bias [BATCH, BIAS_HEAD_SEQ,
///   QUERY_LENGTH, BIAS_KV_SEQ], mask [BATCH, None, QUERY_LENGTH, BIAS_KV_SEQ], query3d
///   [BATCH, HEAD, HEAD_DIM], softmax_aux [EMPTY, KV_HEAD] when `softmax_aux_rank` is 2 and
///   [HEAD] for any other rank.
/// Default PartitionAxis, bthd: query = P(('fsdp', 'dp'), 'sp', 'tp', None).
/// Throws: NotImplementedError "Layout 'thd' is not implemented" for any layout other than
/// "bthd" and "bhtd" (EasyDeL advertises "thd" but does not implement it); ValueError "when
/// using dynamic mode detection shape should be provided" for a dimension mode (EasyDeL passes
/// no shape); anything PartitionManager::resolve throws. Thread-safety: safe to call
/// concurrently.
[[nodiscard]] AttnShardingRules get_shardings(
    const PartitionManager& pm, ModeArg mode, std::string_view layout = "bthd",
    bool qkv_mni_sharding = false, std::optional<std::size_t> softmax_aux_rank = std::nullopt);

/// EasyDeL's resolve_eformer_axis for one token: what `token` (e.g. tokens::kTensorParallel)
/// resolves to in train mode, raw (a name, a tuple, a list or None).
/// Throws: as PartitionAxis::resolve_axis. Thread-safety: safe to call concurrently.
[[nodiscard]] AxisRule resolve_eformer_axis(std::string_view token, const PartitionManager& pm);

/// Options of get_moe_partition_spec, with EasyDeL's defaults.
struct MoeSpecOptions {
  /// Expert-tensor mode: the expert dim is sharded over tp, features are replicated.
  bool tensors_are_expert = false;
  /// A bias [E, dim] rather than a kernel [E, dim1, dim2].
  bool is_bias = false;
  /// With module_view: fold the fsdp axis into the expert dim.
  bool fsdp_is_ep_bound = true;
  /// With module_view: fold the sp axis into the expert dim.
  bool sp_is_ep_bound = true;
  /// Shard the expert dim over (ep, sp if bound, fsdp if bound) instead of ep alone.
  bool module_view = false;
};

/// EasyDeL's get_moe_partition_spec: the spec of an MoE expert kernel or bias.
///   expert-tensor mode: kernel P(tp, None, None), bias P(tp, None);
///   standard: column kernel [E, H, M] P(expert, None, tp); row kernel [E, M, H]
///   P(expert, tp, None); bias (both directions) P(expert, tp) -- EasyDeL's docstring says
///   [expert, None], its code gives [expert, tp], and this follows the code;
///   where expert = ep, or with module_view the tuple (ep, [sp], [fsdp]) (one member -> ep).
/// Axis names come from resolve_eformer_axis, so renamed mesh axes are honoured.
/// Throws: ValueError "direction must be 'row' or 'column', got 'x'"; ValueError when a
/// resolved name is itself a tuple inside the expert tuple (nested tuple in P).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] PartitionSpec get_moe_partition_spec(const PartitionManager& pm,
                                                   std::string_view direction,
                                                   const MoeSpecOptions& options = {});

/// The folded 3-D expert mesh of EasyDeL's fused MoE, in axis order (dp', ep', tp').
struct ExpertMeshShape {
  /// Sizes (dp', ep', tp').
  std::array<std::int64_t, 3> sizes{1, 1, 1};
  /// Names: the resolved DP, EP and TP names (they may coincide when PartitionAxis aliases
  /// them, e.g. expert_parallel_axis = "tp" gives ("dp", "tp", "tp")).
  std::array<AxisRule, 3> names;
  friend bool operator==(const ExpertMeshShape&, const ExpertMeshShape&) = default;
};

/// EasyDeL's _mesh_shape_ep: folds the 5-D mesh into (dp', ep', tp'). The resolved mesh
/// names are assigned to groups in the order tp -> tp, ep -> ep, dp -> dp, fsdp -> (ep if
/// `fsdp_is_ep_bound` else dp), sp -> (ep if `sp_is_ep_bound` else dp), skipping a name
/// already assigned; a group's size is the product of its axes' sizes, a name missing from
/// the mesh (or not a plain name) counting as 1.
/// Example: mesh (dp=1, fsdp=4, ep=2, tp=2, sp=2), both bound: sizes (1, 16, 2).
/// EasyDeL then builds the mesh as mesh.devices.flatten().reshape(sizes): a relabelling of the
/// devices in flat order, not a coordinate-preserving fold (see docs/sharding.md).
/// Throws: as PartitionAxis::resolve_axis. Thread-safety: safe to call concurrently.
[[nodiscard]] ExpertMeshShape mesh_shape_ep(const Mesh& mesh, const PartitionManager& pm,
                                            bool fsdp_is_ep_bound = true,
                                            bool sp_is_ep_bound = true);

/// The folded expert mesh as a Mesh over the same device ids (device i of the result is
/// device i of `mesh`, as flatten().reshape does).
/// Throws: ValueError when the three names are not distinct plain names (JAX cannot build
/// such a mesh either), naming them; as mesh_shape_ep. Thread-safety: safe to call
/// concurrently.
[[nodiscard]] Mesh expert_mesh(const Mesh& mesh, const PartitionManager& pm,
                               bool fsdp_is_ep_bound = true, bool sp_is_ep_bound = true);

/// The arguments of create_stable_sharding, each optional as in EasyDeL.
struct StableShardingArgs {
  /// The base spec; nullopt is EasyDeL's None (-> the result is None).
  std::optional<PartitionSpec> state_ps;
  /// Dims whose entry is kept (negative counts from the end); nullopt keeps every dim.
  std::optional<std::vector<std::int64_t>> preserved_indices;
  /// Where the kept entries are taken from instead of state_ps.
  std::optional<PartitionSpec> clone_ps;
  /// EasyDeL's `dep is None` (-> the result is None).
  bool dep_is_none = false;
  /// Shape of the tensor to correct against (get_corrected_named_sharding); none: no correction.
  std::optional<std::vector<std::int64_t>> tensor_shape;
};

/// EasyDeL's OperationImpl.create_stable_sharding over `mesh` (nullopt is EasyDeL's
/// `metadata.mesh is None`, which returns state_ps unchanged):
///  - dep_is_none or no state_ps: nullopt;
///  - no preserved_indices: state_ps, corrected against tensor_shape when one is given;
///  - else a spec of len(state_ps) entries, all None except the preserved dims, which take
///    state_ps's (or clone_ps's) entry; corrected against tensor_shape when one is given.
/// Example: mesh dp=2 fsdp=2 tp=2, state P(('fsdp','dp'), 'sp', 'tp', None), preserved
/// {0, 2}, shape (8, 128, 32, 64) -> P(('fsdp', 'dp'), None, 'tp', None).
/// Throws: IndexError "tuple index out of range" when a preserved index is outside the source
/// spec, "list assignment index out of range" when outside state_ps; NoMeshError when a
/// correction is needed and `mesh` is empty; DuplicateSpecError as
/// get_corrected_named_sharding. Thread-safety: safe to call concurrently.
[[nodiscard]] std::optional<PartitionSpec> create_stable_sharding(const StableShardingArgs& args,
                                                                  const std::optional<Mesh>& mesh);

/// EasyDeL's OperationImpl.get_mode: decode when the query's sequence dim has extent 1 (dim 1
/// for bthd, dim 2 otherwise), else train. Never prefill or insert.
/// Throws: IndexError "tuple index out of range" when the shape is too short.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] Mode get_mode(const std::vector<std::int64_t>& query_shape, bool bthd = true);

/// EasyDeL's _generalize_numeric_path: a regex matching a '/'-joined parameter path with any
/// layer numbers and an optional optimizer prefix: each all-digit part becomes `\d+`, every
/// other part is escaped as Python's re.escape does, and the result is wrapped in
/// `^(?:.*/)?` ... `$`. Example: "model/layers/0/mlp" -> `^(?:.*/)?model/layers/\d+/mlp$`.
/// ASCII digits only (Python's str.isdigit also accepts other Unicode digits).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::string generalize_numeric_path(std::string_view pattern);

/// EasyDeL's mesh_partition_product: the number of blocks an entry splits a dim into. None is
/// 1; a tuple is the product over its non-None members; a member or entry that is not a mesh
/// axis counts as 1 (EasyDeL looks names up with str() and swallows the KeyError).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::int64_t mesh_partition_product(const Mesh& mesh, const AxisRule& entry);

/// EasyDeL's sanitize_partition_spec_for_shape (infra/utils.py): truncates `spec` to the rank,
/// then replaces by None every entry whose mesh_partition_product is > 1 and does not divide
/// its dim. Unlike eformer's correct_spec it does not pad, does not collapse to P(), keeps
/// axes missing from the mesh (they count as size 1) and keeps duplicates; NamedSharding then
/// rejects those. Example: mesh (dp=2, tp=4), shape (8, 6), P('dp', 'tp') -> P('dp', None).
/// Throws: nothing beyond std::bad_alloc. Thread-safety: safe to call concurrently.
[[nodiscard]] PartitionSpec sanitize_partition_spec_for_shape(
    const PartitionSpec& spec, const std::vector<std::int64_t>& shape, const Mesh& mesh);

/// EasyDeL's resolve_safe_sharding (layers/_sharding.py) for a preset: resolves `axes` with
/// `pm` (the preset's own mode wins; with a dimension mode the shape decides, and when that
/// fails it is retried without the shape), then, when a mesh is available (`mesh` if
/// non-empty, else this thread's current mesh if non-empty), drops to None every entry at a
/// dim < rank whose mesh_partition_product is > 1 and does not divide the dim. No truncation,
/// no padding; missing axes count as 1.
/// Returns nullopt when `pm` is null or every resolution attempt fails: EasyDeL then returns
/// the axes object unchanged, which is not a spec.
/// Example: mesh fsdp=8, ColumnWise, shape (4095, 11008) -> P(None, 'tp').
/// Throws: nothing (resolution errors are swallowed as EasyDeL does).
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::optional<PartitionSpec> resolve_safe_sharding(
    const DynamicShardingAxes& axes, const std::vector<std::int64_t>& shape,
    const PartitionManager* pm, const std::optional<Mesh>& mesh = std::nullopt);

/// resolve_safe_sharding for raw semantic axes resolved in `mode` (EasyDeL's default: train).
/// Returns nullopt when `pm` is null or resolution fails. Throws: nothing.
/// Thread-safety: safe to call concurrently.
[[nodiscard]] std::optional<PartitionSpec> resolve_safe_sharding(
    const std::vector<AxisRule>& axes, const std::vector<std::int64_t>& shape,
    const PartitionManager* pm, const std::optional<Mesh>& mesh = std::nullopt,
    ModeArg mode = Mode::kTrain);

}  // namespace numesh::sharding::easydel
