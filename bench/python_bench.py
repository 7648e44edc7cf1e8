#!/usr/bin/python3
"""The Python package's cost over the C++ it calls, measured in one sitting.

    bench/python_bench.py --build build/portable --model DIR [--rounds 3] [--tokens 32]

- resolve: numesh.PartitionAxis.resolve_spec and PartitionManager.resolve(preset, shape) per
  call (timeit), beside sharding_bench's BM_ResolveSpec and BM_ManagerResolvePreset (the same
  calls in C++, Google Benchmark);
- logits: CausalLM.logits of 32 and 128 random ids (wall time of the call) against
  model_bench's BM_Logits (CausalLm::logits in C++, Google Benchmark), alternated --rounds times,
  medians;
- train: Trainer.step against `numesh train --log` (its seconds column) on the same
  checkpoint, data ([batch 2, --tokens + 1] random ids) and options, medians of the steps after
  the first (which compiles), the two alternated --rounds times;
- generate: CausalLM.generate of a prompt of --tokens random ids and --tokens new tokens (wall
  time of the call) against `numesh generate --json` on the same ids (its prefill_seconds +
  decode_seconds, the same work without the program's start and load), medians of --rounds
  alternated rounds.
Needs the build's Python package (<build>/python) and its numesh, sharding_bench and model_bench
programs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="a Release build holding python/, tools/numesh, bench/sharding_bench")
    ap.add_argument("--model", required=True, help="a model folder (config.json and safetensors)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.build, "python"))
    import numpy as np

    import numesh

    cli = os.path.join(a.build, "tools", "numesh")
    bench = os.path.join(a.build, "bench", "sharding_bench")

    # Resolution, per call.
    paxis = numesh.PartitionAxis()
    pm = numesh.PartitionManager(paxis)
    axes = [numesh.BATCH, numesh.QUERY_LENGTH, numesh.EMBED]
    n = 20000
    py_spec = min(timeit.repeat(lambda: paxis.resolve_spec(axes, numesh.MODE_TRAIN), number=n, repeat=5)) / n
    py_preset = min(timeit.repeat(lambda: pm.resolve(numesh.HiddenStateSharding, shape=(8, 1, 4096)),
                                  number=n, repeat=5)) / n
    out = subprocess.run([bench, "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    cpp = {b["name"]: b["real_time"] * {"ns": 1e-9, "us": 1e-6}[b["time_unit"]] for b in json.loads(out)["benchmarks"]}
    print(f"resolve_spec:           Python {py_spec * 1e6:.2f} us, C++ {cpp['BM_ResolveSpec'] * 1e6:.2f} us")
    print(f"resolve(preset, shape): Python {py_preset * 1e6:.2f} us, C++ {cpp['BM_ManagerResolvePreset'] * 1e6:.2f} us")

    # logits, alternated with model_bench (the same call in C++, the same ids' count).
    model_bench = os.path.join(a.build, "bench", "model_bench")
    lm = numesh.CausalLM.from_pretrained(a.model)
    py_logits, cpp_logits = {32: [], 128: []}, {32: [], 128: []}
    for _ in range(a.rounds):
        out = subprocess.run([model_bench, "--benchmark_format=json", "--benchmark_min_time=2"], check=True,
                             capture_output=True, text=True, env={**os.environ, "NUMESH_BENCH_MODEL": a.model}).stdout
        for b in json.loads(out)["benchmarks"]:
            cpp_logits[int(b["name"].split("/")[1])].append(b["real_time"] * 1e-3)  # ms
        for t in (32, 128):
            ids = np.random.default_rng(1).integers(3, 1000, size=t).tolist()
            lm.logits(ids)  # compiles
            times = []
            for _ in range(20):
                start = time.perf_counter()
                lm.logits(ids)
                times.append(time.perf_counter() - start)
            py_logits[t].append(statistics.median(times))
    del lm
    for t in (32, 128):
        py, c = statistics.median(py_logits[t]), statistics.median(cpp_logits[t])
        print(f"logits of {t} ids: Python {py * 1e3:.2f} ms, C++ {c * 1e3:.2f} ms (Python / C++ {py / c:.3f}; "
              f"rounds: Python {[round(x * 1e3, 2) for x in py_logits[t]]}, C++ {[round(x * 1e3, 2) for x in cpp_logits[t]]})")

    # A training step, against the program's own timing of each step, alternated by round.
    py_steps, cli_steps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        steps = 4
        rows = np.random.default_rng(2).integers(3, 1000, size=(2 * steps, a.tokens + 1)).astype(np.int32)
        np.save(os.path.join(tmp, "data.npy"), rows)
        log = os.path.join(tmp, "log.csv")
        for _ in range(a.rounds):
            subprocess.run([cli, "train", "--model", a.model, "--data", os.path.join(tmp, "data.npy"), "--batch",
                            "2", "--steps", str(steps), "--log", log, "--quiet"], check=True, capture_output=True)
            with open(log) as f:
                next(f)
                cli_steps += [float(line.split(",")[5]) for line in f][1:]
            trainer = numesh.Trainer(a.model, batch=2, tokens=a.tokens, total_steps=steps)
            for k in range(steps):
                start = time.perf_counter()
                trainer.step(rows[2 * k:2 * k + 2])
                if k > 0:
                    py_steps.append(time.perf_counter() - start)
            del trainer
    py, c = statistics.median(py_steps), statistics.median(cli_steps)
    print(f"train step (batch 2 x {a.tokens}): Python {py * 1e3:.1f} ms, numesh train {c * 1e3:.1f} ms "
          f"(Python / C++ {py / c:.3f}; steps: Python {[round(t * 1e3, 1) for t in py_steps]}, "
          f"C++ {[round(t * 1e3, 1) for t in cli_steps]})")

    # generate, alternated with the program.
    ids = np.random.default_rng(1).integers(3, 1000, size=a.tokens).tolist()
    lm = numesh.CausalLM.from_pretrained(a.model)
    lm.generate(ids, max_new_tokens=a.tokens, stop_ids=[])  # compiles the programs
    py_times, cli_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.rounds):
            start = time.perf_counter()
            lm.generate(ids, max_new_tokens=a.tokens, stop_ids=[])
            py_times.append(time.perf_counter() - start)
            path = os.path.join(tmp, "out.json")
            subprocess.run([cli, "generate", "--model", a.model, "--ids", ",".join(map(str, ids)),
                            "--max-new-tokens", str(a.tokens), "--ignore-eos", "--json", path],
                           check=True, capture_output=True)
            j = json.load(open(path))
            cli_times.append(j["prefill_seconds"] + j["decode_seconds"])
    py, c = statistics.median(py_times), statistics.median(cli_times)
    print(f"generate {a.tokens}+{a.tokens} tokens: Python {py * 1e3:.1f} ms, numesh generate {c * 1e3:.1f} ms "
          f"(Python / C++ {py / c:.3f}; rounds: Python {[round(t * 1e3, 1) for t in py_times]}, "
          f"C++ {[round(t * 1e3, 1) for t in cli_times]})")


if __name__ == "__main__":
    main()
