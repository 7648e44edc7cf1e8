#!/usr/bin/python3
"""PyTorch's top-k mixture-of-experts forward as a plain loop over experts, fp32: x[T, H] @
router[H, E], softmax, top-k weights renormalised to sum 1, then per expert the tokens routed to
it go through silu(x @ gate[e]) * (x @ up[e]) @ down[e] (gate/up [E, H, F], down [E, F, H]) and
are scattered back with index_add_. Run it in PyTorch's best configuration on this machine kind
(docs/benchmarks.md, "PyTorch's configuration"): OPENBLAS_NUM_THREADS=2 with
torch.set_num_threads(1):

    OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/moe_torch.py [--threads 1] [--repeats 30]

Prints the median time, GFLOP/s and tokens/s. GFLOP/s counts only the GEMMs done: the router and
3 * 2 * H * F per routed token-assignment (T * k of them). Exits 2 when torch is missing
(Debian: python3-torch).
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("moe_torch: error: torch is not installed for this interpreter "
          "(apt-get install python3-torch; run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(2)


def moe(x, router, gate, up, down, k):
    probs = torch.softmax(x @ router, dim=-1)
    weights, experts = probs.topk(k, dim=-1)  # [T, k]
    weights = weights / weights.sum(dim=-1, keepdim=True)
    y = torch.zeros_like(x)
    for e in range(gate.shape[0]):
        tokens, slots = torch.where(experts == e)
        if tokens.numel() == 0:
            continue
        xe = x[tokens]
        h = F.silu(xe @ gate[e]) * (xe @ up[e])
        y.index_add_(0, tokens, (h @ down[e]) * weights[tokens, slots][:, None])
    return y


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--repeats", type=int, default=30, help="timed forwards")
    parser.add_argument("--tokens", type=int, default=512, help="T (default 512)")
    parser.add_argument("--hidden", type=int, default=1024, help="H (default 1024)")
    parser.add_argument("--ffn", type=int, default=1024, help="F, per expert (default 1024)")
    parser.add_argument("--experts", type=int, default=8, help="E (default 8)")
    parser.add_argument("--top-k", type=int, default=2, help="k (default 2)")
    args = parser.parse_args()
    t, hidden, ffn, e, k = args.tokens, args.hidden, args.ffn, args.experts, args.top_k
    if not 1 <= k <= e:
        parser.error("--top-k must be between 1 and --experts")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, hidden, generator=g)
    router = torch.randn(hidden, e, generator=g) * 0.02
    gate = torch.randn(e, hidden, ffn, generator=g) * 0.02
    up = torch.randn(e, hidden, ffn, generator=g) * 0.02
    down = torch.randn(e, ffn, hidden, generator=g) * 0.02
    with torch.no_grad():
        for _ in range(3):
            moe(x, router, gate, up, down, k)
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            moe(x, router, gate, up, down, k)
            samples.append(time.perf_counter() - t0)
    median = statistics.median(samples)
    flops = 2.0 * t * hidden * e + 3.0 * 2.0 * hidden * ffn * t * k
    print(f"torch moe: median {median * 1e3:.2f} ms, {flops / median / 1e9:.1f} GFLOP/s, "
          f"{t / median:.0f} tokens/s (T={t} H={hidden} F={ffn} E={e} k={k}, "
          f"set_num_threads({args.threads}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
