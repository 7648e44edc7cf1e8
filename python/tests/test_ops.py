"""numesh.ops: the layers of `numesh op` on NumPy arrays, against PyTorch's float64 forms of
tests/ops/torch_check.py (the same references the C++ operators are checked with) on meshes of
one and two devices and in every mode; bf16 in and out as uint16; bad input by type and
message."""

import sys

import numpy as np
import pytest

import numesh
from conftest import ROOT, share_of_a_python_thread_during

sys.path.insert(0, str(ROOT / "tests" / "ops"))
sys.path.insert(0, str(ROOT / "tests" / "common"))
torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is the reference of these tests")
torch_check = pytest.importorskip("torch_check")


def mesh(dims):
    """A mesh of prod(dims) one-core devices on any machine (a synthetic topology)."""
    n = int(np.prod(dims))
    return numesh.DeviceMesh(dims, ("dp", "ep", "tp"),
                             topology=numesh.Topology.from_synthetic(f"numa:{n} core:1 pu:1"))


MESHES = {"one device": (1, 1, 1), "tp2": (1, 1, 2), "dp2": (2, 1, 1), "ep2": (1, 2, 1)}


def arrays(seed, **shapes):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * (0.3 if name != "x" else 1.0)).astype(np.float32)
            for name, shape in shapes.items()}


def t64(a):
    return torch.from_numpy(np.asarray(a)).double()


def assert_close(got, want, bound, what):
    ok, err, text = torch_check.compare(t64(got), want, bound)
    assert ok, f"{what}: {text}"
    assert got.dtype == np.float32


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_mlp_is_torchs(kind, mesh_name):
    if kind == "gelu":
        a = arrays(1, x=(8, 16), w1=(16, 24), w2=(24, 16))
        want = torch_check.mlp_gelu(t64(a["x"]), t64(a["w1"]), t64(a["w2"]))
    else:
        a = arrays(2, x=(8, 16), w_gate=(16, 24), w_up=(16, 24), w_down=(24, 16))
        want = torch_check.mlp_swiglu(t64(a["x"]), t64(a["w_gate"]), t64(a["w_up"]), t64(a["w_down"]))
    x = a.pop("x")
    y = numesh.ops.mlp(x, mesh=mesh(MESHES[mesh_name]), **a)
    assert y.shape == (8, 16)
    assert_close(y, want, torch_check.BOUNDS["sharded"], f"mlp {kind} on {mesh_name}")


ATTENTION = dict(x=(2, 6, 16), wq=(16, 16), wk=(16, 8), wv=(16, 8), wo=(16, 16))


def torch_attention(a, mode, position, heads=4, kv_heads=2):
    """The attention layer of torch_check with its cache: the prefix first, then the chunk the
    mode times (decode: the last token; insert: from `position`)."""
    x = t64(a["x"])
    t = x.shape[1]
    start = {"decode": t - 1, "insert": position}.get(mode, 0)
    p = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": 16 // heads,
         "rope_theta": 10000.0, "causal": True}
    layer = torch_check.AttentionLayer(t64(a["wq"]), t64(a["wk"]), t64(a["wv"]), t64(a["wo"]), p)
    if start > 0:
        layer(x[:, :start], 0)
    return layer(x[:, start:], start)


@pytest.mark.parametrize("mesh_name", ["one device", "tp2", "dp2"])
@pytest.mark.parametrize("mode", ["train", "prefill", "decode", "insert"])
def test_attention_is_torchs_in_every_mode(mode, mesh_name):
    a = arrays(3, **ATTENTION)
    y = numesh.ops.attention(a["x"], wq=a["wq"], wk=a["wk"], wv=a["wv"], wo=a["wo"], heads=4,
                             kv_heads=2, mode=mode, position=2 if mode == "insert" else -1,
                             mesh=mesh(MESHES[mesh_name]))
    want = torch_attention(a, mode, 2)
    assert y.shape == tuple(want.shape)
    assert_close(y, want, torch_check.BOUNDS["sharded"], f"attention {mode} on {mesh_name}")


def test_eformers_mode_strings_name_the_same_modes():
    a = arrays(3, **ATTENTION)
    kw = dict(wq=a["wq"], wk=a["wk"], wv=a["wv"], wo=a["wo"], heads=4, kv_heads=2, mesh=mesh((1, 1, 1)))
    assert np.array_equal(numesh.ops.attention(a["x"], mode=numesh.MODE_DECODE, **kw),
                          numesh.ops.attention(a["x"], mode="decode", **kw))


@pytest.mark.parametrize("mesh_name", ["one device", "ep2", "tp2"])
@pytest.mark.parametrize("top_k,capacity,renormalize", [(2, 0.0, True), (1, 0.0, False), (2, 0.5, True)])
def test_moe_is_torchs_with_its_routing(top_k, capacity, renormalize, mesh_name):
    a = arrays(4, x=(10, 16), router=(16, 4), w_gate=(4, 16, 12), w_up=(4, 16, 12), w_down=(4, 12, 16))
    run = numesh.ops.run("moe", a["x"], {k: v for k, v in a.items() if k != "x"},
                         mesh=mesh(MESHES[mesh_name]), top_k=top_k, capacity=capacity,
                         renormalize=renormalize)
    want, loads = torch_check.moe(t64(a["x"]), t64(a["router"]), t64(a["w_gate"]), t64(a["w_up"]),
                                  t64(a["w_down"]), top_k, capacity, renormalize)
    assert_close(run.y, want, torch_check.BOUNDS["sharded"], f"moe on {mesh_name}")
    assert run.tokens_per_expert == [int(n) for n in loads[0]]
    assert run.dropped == 10 * top_k - sum(run.tokens_per_expert)
    y = numesh.ops.moe(a["x"], router=a["router"], w_gate=a["w_gate"], w_up=a["w_up"],
                       w_down=a["w_down"], top_k=top_k, capacity=capacity, renormalize=renormalize,
                       mesh=mesh(MESHES[mesh_name]))
    assert np.array_equal(y, run.y)


BLOCK = dict(x=(1, 6, 16), attn_norm=(16,), ffn_norm=(16,), wq=(16, 16), wk=(16, 8), wv=(16, 8),
             wo=(16, 16), w_gate=(16, 24), w_up=(16, 24), w_down=(24, 16))


@pytest.mark.parametrize("mesh_name", ["one device", "tp2"])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_block_is_torchs(mode, mesh_name):
    a = arrays(5, **BLOCK)
    a["attn_norm"] += 1.0
    a["ffn_norm"] += 1.0
    weights = {k: v for k, v in a.items() if k != "x"}
    y = numesh.ops.block(a["x"], heads=4, kv_heads=2, mode=mode, mesh=mesh(MESHES[mesh_name]), **weights)
    eps = 1e-6
    x = t64(a["x"])
    p = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 4, "rope_theta": 10000.0, "causal": True}
    attn = torch_check.AttentionLayer(t64(a["wq"]), t64(a["wk"]), t64(a["wv"]), t64(a["wo"]), p)

    def block(xs, position):
        h = xs + attn(torch_check.rmsnorm(xs, t64(a["attn_norm"]), eps), position)
        n = torch_check.rmsnorm(h, t64(a["ffn_norm"]), eps)
        return h + torch_check.mlp_swiglu(n, t64(a["w_gate"]), t64(a["w_up"]), t64(a["w_down"]))

    if mode == "decode":
        block(x[:, :5], 0)
        want = block(x[:, 5:], 5)
    else:
        want = block(x, 0)
    assert_close(y, want, torch_check.BOUNDS["sharded"], f"block {mode} on {mesh_name}")


def test_run_gives_the_dense_reference_the_plan_and_the_time():
    a = arrays(6, x=(8, 16), w_gate=(16, 24), w_up=(16, 24), w_down=(24, 16))
    run = numesh.ops.run("mlp", a["x"], {k: v for k, v in a.items() if k != "x"}, mesh=mesh((1, 1, 2)),
                         repeats=3)
    want = torch_check.mlp_swiglu(t64(a["x"]), t64(a["w_gate"]), t64(a["w_up"]), t64(a["w_down"]))
    assert_close(run.reference, want, torch_check.BOUNDS["reference"], "the dense reference")
    # F split over tp: the partial outputs are summed over it.
    assert "mlp.out     AllReduce(sum, axes=[tp])" in run.plan, run.plan
    assert run.seconds > 0
    assert numesh.ops.run("mlp", a["x"], {k: v for k, v in a.items() if k != "x"}, check=False).reference is None


def test_bf16_goes_in_and_out_as_uint16():
    values = np.array([[1.0, -2.5, 3.14159, 1e-30], [np.inf, -np.inf, 65504.0, 1.0 + 2**-8]], np.float32)
    bits = numesh.to_bf16(values)
    assert bits.dtype == np.uint16 and bits.shape == values.shape
    # torch's own conversion (round to nearest even) gives the same bits.
    want = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bits, want)
    assert np.array_equal(numesh.from_bf16(bits), torch.from_numpy(values).to(torch.bfloat16).float().numpy())
    assert np.isnan(numesh.from_bf16(numesh.to_bf16(np.array([np.nan], np.float32))))[0]


@pytest.mark.parametrize("mesh_name", ["one device", "tp2"])
def test_bf16_weights_are_torchs_bf16_projections(mesh_name):
    a = arrays(7, x=(8, 16), w_gate=(16, 24), w_up=(16, 24), w_down=(24, 16))
    w = {k: v for k, v in a.items() if k != "x"}
    y = numesh.ops.mlp(a["x"], dtype="bf16", mesh=mesh(MESHES[mesh_name]), **w)
    want = torch_check.mlp_swiglu(t64(a["x"]), t64(a["w_gate"]), t64(a["w_up"]), t64(a["w_down"]), "bf16")
    assert_close(y, want, torch_check.BOUNDS["bf16_sharded"], f"bf16 mlp on {mesh_name}")
    # Weights given as bf16 bits are the float32 weights rounded to bf16: the same output.
    as_bits = numesh.ops.mlp(a["x"], dtype="bf16", mesh=mesh(MESHES[mesh_name]),
                             **{k: numesh.to_bf16(v) for k, v in w.items()})
    assert np.array_equal(as_bits, y)


def test_bad_input_is_named():
    a = arrays(8, x=(8, 16), w1=(16, 24), w2=(24, 16))
    with pytest.raises(ValueError, match=r"op 'conv': expected mlp, attention, moe or block"):
        numesh.ops.run("conv", a["x"], {})
    with pytest.raises(TypeError, match=r"mlp is missing input w2 \(it needs x, w1, w2\)"):
        numesh.ops.run("mlp", a["x"], {"w1": a["w1"]})
    with pytest.raises(TypeError, match=r"mlp takes x, w1, w2 with these inputs; w3 is not among them"):
        numesh.ops.run("mlp", a["x"], {"w1": a["w1"], "w2": a["w2"], "w3": a["w2"]})
    # An input of the other form (SwiGLU's w_up beside GELU's w1, w2) is not dropped silently.
    with pytest.raises(TypeError, match=r"mlp takes x, w1, w2 with these inputs; w_up is not among them"):
        numesh.ops.run("mlp", a["x"], {"w1": a["w1"], "w2": a["w2"], "w_up": a["w1"]})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'w3'"):
        numesh.ops.mlp(a["x"], w1=a["w1"], w3=a["w2"])
    with pytest.raises(TypeError, match=r"w1 is an array of float64; give float32"):
        numesh.ops.mlp(a["x"], w1=a["w1"].astype(np.float64), w2=a["w2"])
    with pytest.raises(TypeError, match=r"x is a <class 'list'>; give a NumPy array"):
        numesh.ops.mlp([[1.0]], w1=a["w1"], w2=a["w2"])
    with pytest.raises(ValueError, match=r"w2 is not C-contiguous; give np.ascontiguousarray\(w2\)"):
        numesh.ops.mlp(a["x"], w1=a["w1"], w2=np.asfortranarray(a["w2"]))
    with pytest.raises(numesh.ShapeError, match=r"x is \[1, 8, 16\]; mlp takes x \[T, H\]"):
        numesh.ops.mlp(a["x"][None], w1=a["w1"], w2=a["w2"])
    with pytest.raises(ValueError, match=r"mode='fast': expected train, prefill, decode or insert"):
        numesh.ops.mlp(a["x"], w1=a["w1"], w2=a["w2"], mode="fast")
    with pytest.raises(ValueError, match=r"dtype 'f8'"):
        numesh.ops.mlp(a["x"], w1=a["w1"], w2=a["w2"], dtype="f8")
    with pytest.raises(ValueError, match=r"repeats=0 must be positive"):
        numesh.ops.run("mlp", a["x"], {"w1": a["w1"], "w2": a["w2"]}, repeats=0)
    at = arrays(9, **ATTENTION)
    w = {k: v for k, v in at.items() if k != "x"}
    with pytest.raises(ValueError, match=r"heads=0: attention needs the number of query heads \(heads=N\)"):
        numesh.ops.attention(at["x"], heads=0, **w)
    with pytest.raises(numesh.ShapeError, match=r"wq is \[16, 16\]; its columns must be heads=3 times head_dim"):
        numesh.ops.attention(at["x"], heads=3, **w)
    with pytest.raises(ValueError, match=r"kv_heads=-1 is negative \(0: as many as the query heads\)"):
        numesh.ops.attention(at["x"], heads=4, kv_heads=-1, **w)
    with pytest.raises(ValueError, match=r"attention: rope_theta nan is not finite"):
        numesh.ops.attention(at["x"], heads=4, kv_heads=2, rope_theta=float("nan"), **w)
    with pytest.raises(ValueError, match=r"position=2 applies to mode=insert only"):
        numesh.ops.attention(at["x"], heads=4, kv_heads=2, position=2, **w)
    with pytest.raises(ValueError, match=r"position=6: x has 6 tokens, insert needs at least one at or after it"):
        numesh.ops.attention(at["x"], heads=4, kv_heads=2, mode="insert", position=6, **w)
    with pytest.raises(ValueError, match=r"kv_layout='bsd': expected bthd or bhtd"):
        numesh.ops.attention(at["x"], heads=4, kv_heads=2, kv_layout="bsd", **w)
    # Empty dims are refused by name, never divided by (an H of 0 once stopped the process).
    z = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    with pytest.raises(numesh.ShapeError, match=r"mlp \(gelu\): up \[0, 16\] has an empty dim"):
        numesh.ops.mlp(z(4, 0), w1=z(0, 16), w2=z(16, 0))
    with pytest.raises(numesh.ShapeError, match=r"moe: router is \[0, 4\], expected \[H, 4\] for 4 experts \(H > 0\)"):
        numesh.ops.moe(z(4, 0), router=z(0, 4), w_gate=z(4, 0, 6), w_up=z(4, 0, 6), w_down=z(4, 6, 0))
    with pytest.raises(numesh.ShapeError, match=r"attention: wq \[0, 8\] has no rows"):
        numesh.ops.attention(z(1, 4, 0), wq=z(0, 8), wk=z(0, 8), wv=z(0, 8), wo=z(8, 0), heads=2)
    # A capacity too large for an int64 limits nothing (it once dropped every token); a
    # non-finite one is refused.
    m = arrays(12, x=(8, 16), router=(16, 4), w_gate=(4, 16, 6), w_up=(4, 16, 6), w_down=(4, 6, 16))
    weights = {k: v for k, v in m.items() if k != "x"}
    huge = numesh.ops.run("moe", m["x"], weights, capacity=1e30)
    assert huge.dropped == 0 and np.array_equal(huge.y, numesh.ops.run("moe", m["x"], weights).y)
    with pytest.raises(ValueError, match=r"moe: capacity_factor inf is not finite"):
        numesh.ops.run("moe", m["x"], weights, capacity=float("inf"))
    # A ShapeError is a ValueError to Python code, and a numesh.Error.
    assert issubclass(numesh.ShapeError, ValueError) and issubclass(numesh.ShapeError, numesh.Error)
    assert issubclass(numesh.IoError, OSError) and issubclass(numesh.IoError, numesh.Error)


def test_outputs_own_their_memory_and_calls_do_not_leak():
    import resource

    a = arrays(10, x=(64, 64), w1=(64, 128), w2=(128, 64))
    m = mesh((1, 1, 1))
    y = numesh.ops.mlp(a["x"], w1=a["w1"], w2=a["w2"], mesh=m)
    assert y.base is not None and not y.flags.owndata  # a capsule owns the values
    for _ in range(500):
        numesh.ops.mlp(a["x"], w1=a["w1"], w2=a["w2"], mesh=m)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(10000):
        numesh.ops.mlp(a["x"], w1=a["w1"], w2=a["w2"], mesh=m)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    # A call builds the layer (~100 KB of weights and buffers): a leak would be ~1 GB.
    assert grown_kib < 16 * 1024, f"the peak RSS grew {grown_kib} KiB over 10,000 calls"


def test_other_threads_run_while_a_layer_computes():
    """The GIL is released while the layer runs: a Python thread runs on meanwhile."""
    a = arrays(11, x=(64, 256), w1=(256, 512), w2=(512, 256))
    share = share_of_a_python_thread_during(
        lambda: numesh.ops.run("mlp", a["x"], {"w1": a["w1"], "w2": a["w2"]}, mesh=mesh((1, 1, 1)),
                               repeats=100, check=False))
    assert share > 0.2, f"a Python thread did {share:.0%} of its work alone while the layer ran"
