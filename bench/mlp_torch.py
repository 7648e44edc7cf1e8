#!/usr/bin/python3
"""PyTorch's MLP forward on the same shape as bench/mlp_bench.cpp: x[512, 1024] @ W1[1024, 4096],
exact GELU, @ W2[4096, 1024], fp32. Run it in PyTorch's best configuration on this machine kind
(docs/benchmarks.md, "PyTorch's configuration"): OPENBLAS_NUM_THREADS=2 with
torch.set_num_threads(1):

    OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/mlp_torch.py [--threads 1] [--repeats 30]

Prints the median time and GFLOP/s. Exits 2 when torch is missing (Debian: python3-torch).
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("mlp_torch: error: torch is not installed for this interpreter "
          "(apt-get install python3-torch; run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(2)

T, H, FF = 512, 1024, 4096


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--repeats", type=int, default=30, help="timed forwards")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g)
    w1 = torch.randn(H, FF, generator=g) * 0.02
    w2 = torch.randn(FF, H, generator=g) * 0.02
    with torch.no_grad():
        for _ in range(3):
            F.gelu(x @ w1) @ w2
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            F.gelu(x @ w1) @ w2
            samples.append(time.perf_counter() - t0)
    median = statistics.median(samples)
    flops = 2.0 * 2.0 * T * H * FF
    print(f"torch mlp forward: median {median * 1e3:.2f} ms, {flops / median / 1e9:.1f} GFLOP/s "
          f"(set_num_threads({args.threads}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
