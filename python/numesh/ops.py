"""numesh's layers on NumPy arrays: what `numesh op` runs, sharded over a mesh of the machine.

Each function takes x and the layer's weights as float32 arrays (or uint16 holding bf16 bits,
numesh.to_bf16), C-contiguous, with the names and shapes of numesh op's files (docs/ops.md),
and returns the output as a float32 array::

    y = numesh.ops.mlp(x, w_gate=g, w_up=u, w_down=d, mesh=numesh.DeviceMesh())

The options shared by all of them:

- ``mesh``: a DeviceMesh (default: the machine's devices on tp);
- ``partition_axis``: lays the layer out (default PartitionAxis());
- ``dtype``: how the devices store the matrices ("f32", "bf16", "f16", "q8_0", "q4_0", "q5_0", "iq4_nl",
  "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"; the arrays are rounded or quantized);
- ``mode``: train, prefill, decode or insert (or eformer's MODE_*), which for attention and
  block also chooses the tokens the output holds: decode the last, insert those from
  ``position`` (default T/2) after the others went into the cache.

run() gives the whole account: the output, the dense reference's, the plan and the time.
"""

from numesh._numesh import LayerRun, run_layer

__all__ = ["LayerRun", "run", "mlp", "attention", "moe", "block"]


def run(op, x, inputs, **options):
    """Runs the layer `op` ("mlp", "attention", "moe", "block") on x and `inputs` (a dict of
    name to array) and returns a LayerRun (y, reference, plan, seconds, tokens_per_expert,
    dropped). Options: those of the functions below, plus ``repeats`` (timed calls, the median
    is reported) and ``check`` (False: no dense reference)."""
    return run_layer(op, x, inputs, **options)


def _given(**arrays):
    """The arrays the caller gave (a None is an input not given)."""
    return {name: a for name, a in arrays.items() if a is not None}


def mlp(x, *, w1=None, w2=None, w_gate=None, w_up=None, w_down=None, mesh=None,
        partition_axis=None, mode="prefill", dtype="f32"):
    """The MLP on x [T, H]: GELU with w1 [H, F], w2 [F, H], or SwiGLU with w_gate, w_up [H, F]
    and w_down [F, H]; F split over the MLP axis. Returns y [T, H]."""
    inputs = _given(w1=w1, w2=w2, w_gate=w_gate, w_up=w_up, w_down=w_down)
    return run_layer("mlp", x, inputs, mesh=mesh, partition_axis=partition_axis, mode=mode,
                     dtype=dtype, check=False).y


def attention(x, *, wq, wk, wv, wo, heads, kv_heads=0, rope_theta=10000.0, kv_layout="bthd",
              mode="prefill", position=-1, mesh=None, partition_axis=None, dtype="f32"):
    """Causal self-attention with RoPE on x [B, T, H]: wq [H, heads*d], wk, wv [H, kv_heads*d]
    (kv_heads 0: heads), wo [heads*d, H]; heads split over the head axis. Returns y of the
    mode's tokens: [B, T, H] in train and prefill, [B, 1, H] in decode."""
    inputs = {"wq": wq, "wk": wk, "wv": wv, "wo": wo}
    return run_layer("attention", x, inputs, mesh=mesh, partition_axis=partition_axis,
                     mode=mode, position=position, kv_layout=kv_layout, dtype=dtype,
                     heads=heads, kv_heads=kv_heads, rope_theta=rope_theta, check=False).y


def moe(x, *, router, w_gate, w_up, w_down, top_k=2, capacity=0.0, renormalize=True,
        mesh=None, partition_axis=None, mode="prefill", dtype="f32"):
    """The mixture of SwiGLU experts on x [T, H]: router [H, E], w_gate, w_up [E, H, F],
    w_down [E, F, H]; each token to its top_k experts (weights renormalised over them unless
    renormalize=False; capacity 0: dropless), experts split over the expert axis. Returns
    y [T, H]."""
    inputs = {"router": router, "w_gate": w_gate, "w_up": w_up, "w_down": w_down}
    return run_layer("moe", x, inputs, mesh=mesh, partition_axis=partition_axis, mode=mode,
                     dtype=dtype, top_k=top_k, capacity=capacity, renormalize=renormalize,
                     check=False).y


def block(x, *, attn_norm, ffn_norm, wq, wk, wv, wo, w_gate, w_up, w_down, heads, router=None,
          kv_heads=0, rope_theta=10000.0, norm_eps=1e-6, top_k=2, capacity=0.0,
          renormalize=True, kv_layout="bthd", mode="prefill", position=-1, mesh=None,
          partition_axis=None, dtype="f32"):
    """One transformer block on x [B, T, H]: RMSNorm (attn_norm [H]), attention, RMSNorm
    (ffn_norm [H]), then the SwiGLU MLP (w_gate, w_up [H, F], w_down [F, H]) or, with a
    router, the MoE (the shapes of moe()); each with its residual. Returns y of the mode's
    tokens, as attention() does."""
    inputs = _given(attn_norm=attn_norm, ffn_norm=ffn_norm, wq=wq, wk=wk, wv=wv, wo=wo,
                    w_gate=w_gate, w_up=w_up, w_down=w_down, router=router)
    return run_layer("block", x, inputs, mesh=mesh, partition_axis=partition_axis, mode=mode,
                     position=position, kv_layout=kv_layout, dtype=dtype, heads=heads,
                     kv_heads=kv_heads, rope_theta=rope_theta, norm_eps=norm_eps, top_k=top_k,
                     capacity=capacity, renormalize=renormalize, check=False).y
