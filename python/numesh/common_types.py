"""eformer's common_types: the semantic-axis tokens, the runtime modes and the constants,
with eformer's names and values (read from numesh's C++ tables, so the two cannot differ)."""

from numesh import _numesh

_T = _numesh._SEMANTIC_TOKENS

EMPTY: str = _T["EMPTY"]
BATCH: str = _T["BATCH"]
LENGTH: str = _T["LENGTH"]
QUERY_LENGTH: str = _T["QUERY_LENGTH"]
KV_LENGTH: str = _T["KV_LENGTH"]
EMBED: str = _T["EMBED"]
HEAD: str = _T["HEAD"]
KV_HEAD: str = _T["KV_HEAD"]
MLP_INTERMEDIATE: str = _T["MLP_INTERMEDIATE"]
VOCAB: str = _T["VOCAB"]
EXPERT: str = _T["EXPERT"]
EXPERT_GATE: str = _T["EXPERT_GATE"]
HEAD_DIM: str = _T["HEAD_DIM"]
KV_HEAD_DIM: str = _T["KV_HEAD_DIM"]
BIAS_HEAD_SEQ: str = _T["BIAS_HEAD_SEQ"]
BIAS_KV_SEQ: str = _T["BIAS_KV_SEQ"]
DATA_PARALLEL: str = _T["DATA_PARALLEL"]
FULLY_SHARDED_DATA_PARALLEL: str = _T["FULLY_SHARDED_DATA_PARALLEL"]
TENSOR_PARALLEL: str = _T["TENSOR_PARALLEL"]
SEQUENCE_PARALLEL: str = _T["SEQUENCE_PARALLEL"]
EXPERT_PARALLEL: str = _T["EXPERT_PARALLEL"]
# eformer's short names of the parallelism tokens.
DP = DATA_PARALLEL
FSDP = FULLY_SHARDED_DATA_PARALLEL
TP = TENSOR_PARALLEL
SP = SEQUENCE_PARALLEL
EP = EXPERT_PARALLEL

MODE_TRAIN: str = _numesh._MODES["MODE_TRAIN"]
MODE_PREFILL: str = _numesh._MODES["MODE_PREFILL"]
MODE_DECODE: str = _numesh._MODES["MODE_DECODE"]
MODE_INSERT: str = _numesh._MODES["MODE_INSERT"]
GENERATION_MODES = frozenset({MODE_DECODE, MODE_INSERT})

NOT_GIVEN = _numesh.NOT_GIVEN
MIN_SHARDING_SIZE: int = _numesh.MIN_SHARDING_SIZE
DEFAULT_MASK_VALUE: float = _numesh.DEFAULT_MASK_VALUE
DEFAULT_SHARDING_STG = (1, -1, 1, 1, 1)
DEFAULT_NAMED_SHARDING_STG = ("dp", "fsdp", "ep", "tp", "sp")

# {token: PartitionAxis field (None for EMPTY)} and {train field: decode twin}, as eformer's
# _SEMANTIC_MAP and _STANDARD_TO_GENERATION_ATTR_MAP.
_SEMANTIC_MAP = dict(_numesh._SEMANTIC_MAP)
_STANDARD_TO_GENERATION_ATTR_MAP = dict(_numesh._STANDARD_TO_GENERATION_ATTR_MAP)

__all__ = [
    "EMPTY",
    "BATCH",
    "LENGTH",
    "QUERY_LENGTH",
    "KV_LENGTH",
    "EMBED",
    "HEAD",
    "KV_HEAD",
    "MLP_INTERMEDIATE",
    "VOCAB",
    "EXPERT",
    "EXPERT_GATE",
    "HEAD_DIM",
    "KV_HEAD_DIM",
    "BIAS_HEAD_SEQ",
    "BIAS_KV_SEQ",
    "DATA_PARALLEL",
    "FULLY_SHARDED_DATA_PARALLEL",
    "TENSOR_PARALLEL",
    "SEQUENCE_PARALLEL",
    "EXPERT_PARALLEL",
    "DP",
    "FSDP",
    "TP",
    "SP",
    "EP",
    "MODE_TRAIN",
    "MODE_PREFILL",
    "MODE_DECODE",
    "MODE_INSERT",
    "GENERATION_MODES",
    "NOT_GIVEN",
    "MIN_SHARDING_SIZE",
    "DEFAULT_MASK_VALUE",
    "DEFAULT_SHARDING_STG",
    "DEFAULT_NAMED_SHARDING_STG",
]

del _T
