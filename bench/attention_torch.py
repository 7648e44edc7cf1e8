#!/usr/bin/python3
"""PyTorch's attention layer written in torch ops (PyTorch 1.13: no scaled_dot_product_attention),
fp32, layout bthd [batch, seq, heads, head_dim]: q/k/v projections, RoPE (rotate-half, theta
10000), GQA (query head h uses kv head h // (heads / kv_heads)), causal softmax(q k^T / sqrt(d)) v
and the output projection. Run it in PyTorch's best configuration on this machine kind
(docs/benchmarks.md, "PyTorch's configuration"): OPENBLAS_NUM_THREADS=2 with
torch.set_num_threads(1):

    OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/attention_torch.py [--threads 1] [--repeats 30]

Measures "prefill" (the full causal layer on x[B, seq, H]) and "decode" (one token against a KV
cache of --cache past positions, its k and v copied into a preallocated cache). Prints the
median time and GFLOP/s, counting 2*m*n*k for every matmul, the QK^T and PV products included;
prefill counts the full T x T score matrix although the causal mask discards half of it. Decode
also prints GB/s, counting the weights plus the KV cache read once. Exits 2 when torch is missing
(Debian: python3-torch).
"""
import argparse
import math
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("attention_torch: error: torch is not installed for this interpreter "
          "(apt-get install python3-torch; run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(2)

THETA = 10000.0


def rope(x, pos):
    """Rotates pairs (i, i + d/2) of x[B, T, h, d] by pos[T] * theta^(-2i/d)."""
    half = x.shape[-1] // 2
    inv_freq = THETA ** (-2.0 * torch.arange(half, dtype=torch.float32) / x.shape[-1])
    angle = pos[:, None].float() * inv_freq[None, :]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def attend(q, k, v, offset):
    """q[B, T, nh, d] at positions offset + t over k, v[B, S, nkv, d] at positions 0..S-1."""
    b, t, nh, d = q.shape
    rep = nh // k.shape[2]
    k = k.repeat_interleave(rep, dim=2).permute(0, 2, 3, 1)  # [B, nh, d, S]
    v = v.repeat_interleave(rep, dim=2).transpose(1, 2)  # [B, nh, S, d]
    scores = (q.transpose(1, 2) @ k) / math.sqrt(d)  # [B, nh, T, S]
    masked = torch.arange(k.shape[-1])[None, :] > (offset + torch.arange(t))[:, None]
    scores.masked_fill_(masked, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [B, nh, T, d]
    return out.transpose(1, 2).reshape(b, t, nh * d)


def prefill(x, w, nh, nkv, d):
    b, t, _ = x.shape
    pos = torch.arange(t)
    q = rope((x @ w["q"]).view(b, t, nh, d), pos)
    k = rope((x @ w["k"]).view(b, t, nkv, d), pos)
    v = (x @ w["v"]).view(b, t, nkv, d)
    return attend(q, k, v, 0) @ w["o"]


def decode(x, w, k_cache, v_cache, nh, nkv, d):
    b, slot = x.shape[0], k_cache.shape[1] - 1
    pos = torch.tensor([slot])
    q = rope((x @ w["q"]).view(b, 1, nh, d), pos)
    k_cache[:, slot:].copy_(rope((x @ w["k"]).view(b, 1, nkv, d), pos))
    v_cache[:, slot:].copy_((x @ w["v"]).view(b, 1, nkv, d))
    return attend(q, k_cache, v_cache, slot) @ w["o"]


def flops(b, t, s, hidden, nh, nkv, d):
    """2*m*n*k over the projections, QK^T and PV for t queries over s keys."""
    projections = 2.0 * b * t * hidden * d * (2 * nh + 2 * nkv)
    return projections + 2.0 * 2.0 * b * nh * t * s * d


def median_seconds(fn, repeats):
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--repeats", type=int, default=30, help="timed forwards per measurement")
    parser.add_argument("--batch", type=int, default=1, help="B (default 1)")
    parser.add_argument("--hidden", type=int, default=1024, help="H (default 1024)")
    parser.add_argument("--heads", type=int, default=16, help="query heads (default 16)")
    parser.add_argument("--kv-heads", type=int, default=4, help="key/value heads (default 4)")
    parser.add_argument("--head-dim", type=int, default=64, help="d, even (default 64)")
    parser.add_argument("--seq", type=int, default=1024, help="prefill tokens (default 1024)")
    parser.add_argument("--cache", type=int, default=1024, help="decode past positions (default 1024)")
    args = parser.parse_args()
    b, hidden, nh, nkv, d = args.batch, args.hidden, args.heads, args.kv_heads, args.head_dim
    if nh % nkv or d % 2:
        parser.error("--heads must be a multiple of --kv-heads and --head-dim must be even")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    w = {"q": torch.randn(hidden, nh * d, generator=g) * 0.02,
         "k": torch.randn(hidden, nkv * d, generator=g) * 0.02,
         "v": torch.randn(hidden, nkv * d, generator=g) * 0.02,
         "o": torch.randn(nh * d, hidden, generator=g) * 0.02}
    x = torch.randn(b, args.seq, hidden, generator=g)
    x1 = torch.randn(b, 1, hidden, generator=g)
    k_cache = torch.randn(b, args.cache + 1, nkv, d, generator=g)
    v_cache = torch.randn(b, args.cache + 1, nkv, d, generator=g)
    shape = f"heads={nh}/{nkv} d={d}, set_num_threads({args.threads})"
    with torch.no_grad():
        median = median_seconds(lambda: prefill(x, w, nh, nkv, d), args.repeats)
        gflops = flops(b, args.seq, args.seq, hidden, nh, nkv, d) / median / 1e9
        print(f"torch attention prefill: median {median * 1e3:.2f} ms, {gflops:.1f} GFLOP/s "
              f"(B={b} T={args.seq} {shape})")
        median = median_seconds(lambda: decode(x1, w, k_cache, v_cache, nh, nkv, d), args.repeats)
        gflops = flops(b, 1, args.cache + 1, hidden, nh, nkv, d) / median / 1e9
        nbytes = 4.0 * (sum(t.numel() for t in w.values()) + k_cache.numel() + v_cache.numel())
        print(f"torch attention decode: median {median * 1e3:.3f} ms, {gflops:.1f} GFLOP/s, "
              f"{nbytes / median / 1e9:.1f} GB/s (cache {args.cache}, B={b} {shape})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
