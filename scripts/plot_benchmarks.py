#!/usr/bin/python3
"""Turns the --json files of `numesh bench memory` and `numesh bench decode` into PNG charts.

    scripts/plot_benchmarks.py [--out DIR] FILE [FILE ...]

Each FILE's kind comes from its "kind" field; the charts are named after the file (its name
without .json, STEM below) and written to DIR (default: the current folder):

  numesh bench memory  STEM_matrix.png   heat maps of the device x NUMA node matrix: read GB/s
                                         and latency ns, every value written in its cell
                                         (only when the file has a matrix: it is measured on
                                         topologies with several nodes, or with --matrix)
                       STEM_threads.png  GB/s (median pass) against threads, one line per
                                         kernel and device, the fastest pass as a faint mark
  numesh bench decode  STEM_sizes.png    decode GB/s (weight and cache bytes per second of the
                                         median step) against the bytes a step reads, one point
                                         per model size, the read bandwidth of the same run as a
                                         line; the right axis gives the fraction of it

Exit status: 0 charts written; 2 bad arguments or a FILE that is not such a JSON file (the
message names the file and what is wrong); 3 the Python module matplotlib is missing (Debian
package python3-matplotlib). Run with Debian's /usr/bin/python3.
"""
import argparse
import json
import math
import os
import sys

KINDS = ("numesh bench memory", "numesh bench decode")
PROG = "plot_benchmarks.py"


class InputError(Exception):
    """A file that is not a bench JSON file of a known kind (the message names it)."""


def fail(message, status=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(status)


def require(cond, path, kind, what):
    if not cond:
        raise InputError(f"{path}: not a complete '{kind}' file: {what}")


def load(path):
    """The parsed file, checked to be a bench JSON file with the keys the charts read."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in KINDS:
        found = f'its "kind" is {json.dumps(kind)}' if isinstance(data, dict) and "kind" in data else \
            'it has no "kind" field'
        raise InputError(f"{path}: not a numesh bench memory or bench decode JSON file ({found}; "
                         f"write one with numesh bench memory --json FILE or numesh bench decode --json FILE)")
    if kind == "numesh bench memory":
        bw = data.get("bandwidth")
        require(isinstance(bw, dict) and isinstance(bw.get("measurements"), list)
                and isinstance(bw.get("devices"), list), path, kind, '"bandwidth" needs "devices" and "measurements"')
        for m in bw["measurements"]:
            require(isinstance(m, dict) and all(k in m for k in ("device", "kernel", "threads", "gbps")),
                    path, kind, "a measurement without device, kernel, threads or gbps")
        matrix = data.get("matrix")
        if matrix is not None:
            require(isinstance(matrix, dict) and all(k in matrix for k in ("devices", "nodes", "read_gbps",
                                                                            "latency_ns")),
                    path, kind, '"matrix" needs "devices", "nodes", "read_gbps" and "latency_ns"')
            rows, cols = len(matrix["devices"]), len(matrix["nodes"])
            for key in ("read_gbps", "latency_ns"):
                require(isinstance(matrix[key], list) and len(matrix[key]) == rows
                        and all(isinstance(r, list) and len(r) == cols for r in matrix[key]),
                        path, kind, f'"matrix.{key}" is not {rows} rows of {cols} values')
    else:
        read = data.get("read")
        require(isinstance(read, dict) and isinstance(read.get("gbps"), (int, float)), path, kind,
                '"read" needs "gbps"')
        models = data.get("models")
        require(isinstance(models, list) and models, path, kind, '"models" is missing or empty')
        for m in models:
            require(isinstance(m, dict) and all(k in m for k in ("hidden", "bytes_per_step", "gbps",
                                                                  "fraction_of_read")),
                    path, kind, "a model without hidden, bytes_per_step, gbps or fraction_of_read")
    return kind, data


def import_pyplot():
    try:
        import matplotlib
    except ImportError as e:
        fail(f"the Python module 'matplotlib' is missing for {sys.executable} ({e}); install Debian's "
             f"python3-matplotlib (apt-get install python3-matplotlib)", status=3)
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024.0


def machine_title(data):
    machine = data.get("machine", {})
    devices = machine.get("devices", [])
    topo = machine.get("topology", {})
    source = topo.get("source", "?")
    where = "this machine" if source == "machine" else f"{source} '{topo.get('origin', '')}'"
    count = f"{len(devices)} device{'' if len(devices) == 1 else 's'}"
    return f"{count} ({machine.get('policy', '?')} policy) on {where}"


def heat_map(ax, plt, values, rows, cols, title, fmt, cmap):
    grid = [[math.nan if v is None else float(v) for v in r] for r in values]
    image = ax.imshow(grid, cmap=cmap, aspect="auto")
    plt.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    for i, r in enumerate(grid):
        for j, v in enumerate(r):
            text = "not\nmeasured" if math.isnan(v) else fmt.format(v)
            # White on dark cells, black on light ones (the cell's luminance).
            red, green, blue, _ = image.cmap(image.norm(v)) if not math.isnan(v) else (1, 1, 1, 1)
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
            ax.text(j, i, text, ha="center", va="center", fontsize=10,
                    color="white" if dark else "black")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("NUMA node holding the memory")
    ax.set_ylabel("device reading it")
    ax.set_title(title)


def plot_memory(plt, data, stem, out):
    written = []
    bw = data["bandwidth"]
    matrix = data.get("matrix")
    if matrix is not None:
        rows = [f"{d['device']} {d.get('label', '')}".strip() for d in matrix["devices"]]
        cols = [f"node {n['node']}{'*' if n.get('note') else ''}" for n in matrix["nodes"]]
        fig, axes = plt.subplots(1, 2, figsize=(6 + 1.6 * len(cols) * 2, 2.5 + 0.6 * len(rows)),
                                 constrained_layout=True)
        heat_map(axes[0], plt, matrix["read_gbps"], rows, cols,
                 f"read GB/s, all of a device's threads\n({human_bytes(matrix.get('bytes', 0))} per node)",
                 "{:.2f}", "viridis")
        heat_map(axes[1], plt, matrix["latency_ns"], rows, cols,
                 f"latency ns per dependent load, one thread\n(random cycle over "
                 f"{human_bytes(matrix.get('latency_bytes', 0))})", "{:.0f}", "magma_r")
        notes = [f"node {n['node']}*: {n['note']}" for n in matrix["nodes"] if n.get("note")]
        title = f"numesh bench memory: {machine_title(data)}"
        if notes:
            title += "\n" + "\n".join(notes[:3]) + ("\n..." if len(notes) > 3 else "")
        fig.suptitle(title, fontsize=9)
        path = os.path.join(out, f"{stem}_matrix.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    else:
        print(f"{PROG}: note: {stem}: no node matrix in the file (one NUMA node without --matrix, or "
              f"--no-matrix): {stem}_matrix.png not written")

    labels = {d["device"]: d.get("label", str(d["device"])) for d in bw["devices"]}
    kernels = []
    for m in bw["measurements"]:
        if m["kernel"] not in kernels:
            kernels.append(m["kernel"])
    styles = ["-", "--", ":", "-."]
    colors = {"read": "tab:blue", "copy": "tab:orange", "triad": "tab:green"}
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    max_threads = 1
    for k in kernels:
        for n, device in enumerate(labels):
            ms = sorted((m for m in bw["measurements"] if m["kernel"] == k and m["device"] == device),
                        key=lambda m: m["threads"])
            if not ms:
                continue
            x = [m["threads"] for m in ms]
            max_threads = max(max_threads, *x)
            name = k if len(labels) == 1 else f"{k}, {device} {labels[device]}"
            ax.plot(x, [m["gbps"] for m in ms], styles[n % len(styles)], marker="o",
                    color=colors.get(k), label=name)
            if all("best_gbps" in m for m in ms):
                ax.plot(x, [m["best_gbps"] for m in ms], linestyle="none", marker="_", markersize=12,
                        color=colors.get(k), alpha=0.6)
    ax.set_xlabel("threads of the device")
    ax.set_ylabel("GB/s (1e9 bytes/s, STREAM's count)")
    ax.set_xticks(range(1, max_threads + 1) if max_threads <= 16 else None)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"bandwidth vs threads, arrays of {human_bytes(bw.get('array_bytes', 0))} "
                 f"(line: median pass, dash: fastest)\n{machine_title(data)}", fontsize=9)
    path = os.path.join(out, f"{stem}_threads.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written


def plot_decode(plt, data, stem, out):
    read = float(data["read"]["gbps"])
    models = sorted(data["models"], key=lambda m: m["bytes_per_step"])
    x = [m["bytes_per_step"] / 1e6 for m in models]
    y = [m["gbps"] for m in models]
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    ax.plot(x, y, marker="o", color="tab:blue", label="decode: bytes of a step / median step time")
    for xi, yi, m in zip(x, y, models):
        ax.annotate(f"H={m['hidden']}\n{m['fraction_of_read']:.0%}", (xi, yi), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.axhline(read, color="tab:red", linestyle="--",
               label=f"read bandwidth of the same run, {read:.1f} GB/s (summed over devices)")
    ax.set_xscale("log")
    # One labelled tick per model (matplotlib labels only powers of ten on a log axis).
    ax.set_xticks(x, [f"{v:.3g}" if v < 1000 else f"{v:.0f}" for v in x])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("MB read per decode step (weights and KV cache, all devices)")
    ax.set_ylabel("GB/s")
    top = max(max(y), read) * 1.25
    ax.set_ylim(0, top)
    right = ax.twinx()
    right.set_ylim(0, top / read if read > 0 else 1)
    right.set_ylabel("fraction of the read bandwidth")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    mesh = data.get("mesh", {})
    shape = ", ".join(f"{n}={s}" for n, s in zip(mesh.get("names", []), mesh.get("sizes", [])))
    ax.set_title(f"decode GB/s vs model size, batch {models[0].get('batch', '?')}, mesh [{shape}]\n"
                 f"{machine_title(data)}", fontsize=9)
    path = os.path.join(out, f"{stem}_sizes.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n", 1)[0],
        epilog="Examples:\n"
               "  build/release/tools/numesh bench memory --json memory.json\n"
               "  build/release/tools/numesh bench decode --sweep-hidden 256,512,1024,2048 --json decode.json\n"
               "  scripts/plot_benchmarks.py memory.json decode.json --out plots\n\n"
               "Charts: FILE's kind decides (STEM is its name without .json):\n"
               "  numesh bench memory -> STEM_matrix.png (device x node read GB/s and latency ns heat\n"
               "                         maps, values annotated; when the file has a matrix) and\n"
               "                         STEM_threads.png (GB/s vs threads per kernel and device)\n"
               "  numesh bench decode -> STEM_sizes.png (decode GB/s vs MB read per step, the read\n"
               "                         bandwidth as a line, its fraction on the right axis)\n"
               "Needs matplotlib: Debian's python3-matplotlib under /usr/bin/python3.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="--json output of numesh bench memory or numesh bench decode")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="folder for the PNG files (created if missing; default: .)")
    args = parser.parse_args(argv)

    inputs = []
    stems = {}
    for path in args.files:
        try:
            kind, data = load(path)
        except InputError as e:
            fail(str(e))
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem in stems:
            fail(f"{path} and {stems[stem]} would write the same charts ({stem}_*.png): rename one")
        stems[stem] = path
        inputs.append((kind, data, stem))
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"--out {args.out}: cannot create the folder ({e.strerror})")

    plt = import_pyplot()
    for kind, data, stem in inputs:
        written = plot_memory(plt, data, stem, args.out) if kind == "numesh bench memory" else \
            plot_decode(plt, data, stem, args.out)
        for path in written:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
