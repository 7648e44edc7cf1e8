#!/usr/bin/python3
"""PyTorch's gloo all-reduce on this machine: the yardstick `numesh bench collectives` is held
against (docs/benchmarks.md). W processes on one host, torch.distributed with the gloo backend,
file:// rendezvous, one intra-op thread each; fp32 sum of SIZE bytes per rank.

Usage:  /usr/bin/python3 bench/gloo_allreduce.py [--world 2] [--sizes 4K,64K,1M,64M]
                                                 [--repeats 20] [--json FILE]
Prints one line per size and, with --json, one record per size in the same fields as
`numesh bench collectives --json` (name, devices, bytes, median_seconds). Needs Debian's
python3-torch (torch 1.13) under /usr/bin/python3; exits with status 2 and a message otherwise.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def parse_size(text):
    units = {"": 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
             "G": 1 << 30, "GiB": 1 << 30}
    digits = "".join(c for c in text if c.isdigit())
    unit = text[len(digits):]
    if not digits or unit not in units:
        raise SystemExit(f"gloo_allreduce: error: bad size '{text}' (use e.g. 4K, 64MiB)")
    return int(digits) * units[unit]


def worker(rank, world, init_file, sizes, repeats, queue):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    results = []
    for size in sizes:
        x = torch.full((size // 4,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(x)  # warm-up
        samples = []
        for _ in range(repeats):
            x.fill_(float(rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            samples.append(time.perf_counter() - t0)
        expected = world * (world + 1) / 2
        if float(x[0]) != expected or float(x[-1]) != expected:
            raise RuntimeError(f"wrong all-reduce result {float(x[0])}, expected {expected}")
        results.append(statistics.median(samples))
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2, help="processes (ranks), default 2")
    parser.add_argument("--sizes", default="4K,64K,1M,64M", help="bytes per rank, comma-separated")
    parser.add_argument("--repeats", type=int, default=20, help="timed all-reduces per size")
    parser.add_argument("--json", help="write one JSON record per size to this file")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
        import torch.multiprocessing as mp
    except ImportError:
        print("gloo_allreduce: error: torch is not installed for this interpreter "
              "(Debian: apt-get install python3-torch; run with /usr/bin/python3)", file=sys.stderr)
        return 2
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=worker, args=(r, args.world, init_file, sizes, args.repeats, queue))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        medians = queue.get()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                print(f"gloo_allreduce: error: a rank exited with status {p.exitcode}", file=sys.stderr)
                return 1
    records = []
    for size, median in zip(sizes, medians):
        print(f"gloo all-reduce  world {args.world}  {size:>10} bytes  median {median * 1e6:10.1f} us"
              f"  {size / median / 1e9:6.2f} GB/s")
        records.append({"name": f"gloo-all-reduce/{size}", "collective": "all-reduce",
                        "devices": args.world, "bytes": size, "median_seconds": median})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
