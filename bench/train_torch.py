#!/usr/bin/python3
"""PyTorch's training step of a Hugging Face-layout Llama, fp32, the yardstick `numesh train` is
held against (scripts/bench_train.sh). The model is written in plain torch ops (PyTorch 1.13 has
no scaled_dot_product_attention): embedding, per layer RMSNorm, attention (q/k/v projections,
RoPE rotate-half with the config's rope_theta, GQA: query head h uses kv head h // (heads /
kv_heads), causal softmax(q k^T / sqrt(d) + mask) v, output projection), RMSNorm, SwiGLU MLP
(down(silu(gate(x)) * up(x))), the final RMSNorm and the LM head (tied to the embedding when
tie_word_embeddings is true). One step: the mean cross-entropy over all B*T targets,
loss.backward(), torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW.

Usage:  /usr/bin/python3 bench/train_torch.py --config config.json [--batch 4] [--tokens 128]
            [--steps 10] [--warmup 3] [--threads 1] [--ddp R] [--gemm-ceiling] [--json FILE]

Run it in PyTorch's best configuration on this machine kind (docs/benchmarks.md, "PyTorch's
configuration"): OPENBLAS_NUM_THREADS=2 with --threads 1. Debian's torch runs its fp32 matmuls
through OpenBLAS, whose thread count torch.set_num_threads does not control; the environment
variable is read when torch is imported, so the caller sets it:

    OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/train_torch.py --config DIR/config.json --threads 1

config.json fields read: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
num_key_value_heads (default num_attention_heads), head_dim (default hidden_size /
num_attention_heads), vocab_size, rms_norm_eps (default 1e-6), rope_theta (default 10000),
tie_word_embeddings (default false). rope_scaling is ignored (it changes the rotation
frequencies, not the work).

Data: random token ids [B, T+1] per step (fixed seed), inputs [:, :T], targets [:, 1:].
Weights: normal(0, 0.02), norms 1. Timing: time.perf_counter() around each whole step (zero_grad,
forward, backward, clipping, optimizer step); of the --steps steps run, the first --warmup are
not counted. Reported: median and mean step seconds, tokens/s (B*T / median) and model FLOP/s,
6 x parameters x tokens / median, where parameters counts every trained tensor, the embedding
table included (a tied embedding once); the count without the embedding table is printed too.

--ddp R runs R processes (torch.multiprocessing spawn, torch.distributed gloo on 127.0.0.1 and a
free port), each with torch.set_num_threads(--threads), the global batch B split evenly over the
ranks, the model in DistributedDataParallel; rank 0 times and reports.

--gemm-ceiling also times torch.mm of fp32 [B*T, hidden] x [hidden, intermediate] (the MLP's
up-projection) in the same thread settings: median over --gemm-repeats, GFLOP/s = 2*M*N*K / time.
--steps 0 with --gemm-ceiling times the GEMM alone.

Exits 2 when torch is missing (Debian: python3-torch) and on a bad option (argparse's usage
error), 1 with a message on a config it cannot run or a failed DDP rank.
"""
import argparse
import json
import math
import os
import queue
import socket
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("train_torch: error: torch is not installed for this interpreter "
          "(apt-get install python3-torch; run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(2)

DATA_SEED = 1234
WEIGHT_SEED = 0
INIT_STD = 0.02


class ConfigError(Exception):
    """A config.json or option that the benchmark cannot run, with a message naming it."""


class LlamaShape:
    """The fields of a Hugging Face Llama config.json that the model reads, checked."""

    def __init__(self, doc, source):
        def positive(key, default=None):
            value = doc.get(key, default)
            if value is None:
                raise ConfigError(f"{source}: '{key}' is missing")
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{source}: '{key}' is {value!r}; it must be a positive integer")
            return value

        def number(key, default):
            value = doc.get(key, default)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{source}: '{key}' is {value!r}; it must be a positive number")
            return float(value)

        self.hidden = positive("hidden_size")
        self.intermediate = positive("intermediate_size")
        self.layers = positive("num_hidden_layers")
        self.heads = positive("num_attention_heads")
        self.kv_heads = positive("num_key_value_heads", self.heads)
        if doc.get("head_dim") is None:
            if self.hidden % self.heads:
                raise ConfigError(f"{source}: hidden_size {self.hidden} is not a multiple of "
                                  f"num_attention_heads {self.heads}; give head_dim")
            self.head_dim = self.hidden // self.heads
        else:
            self.head_dim = positive("head_dim")
        self.vocab = positive("vocab_size")
        self.eps = number("rms_norm_eps", 1e-6)
        self.theta = number("rope_theta", 10000.0)
        self.tied = doc.get("tie_word_embeddings", False)
        if not isinstance(self.tied, bool):
            raise ConfigError(f"{source}: 'tie_word_embeddings' is {self.tied!r}; it must be true or false")
        if self.heads % self.kv_heads:
            raise ConfigError(f"{source}: num_attention_heads {self.heads} is not a multiple of "
                              f"num_key_value_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"{source}: head_dim {self.head_dim} is odd; RoPE rotates pairs")
        for key in ("attention_bias", "mlp_bias"):
            if doc.get(key, False):
                raise ConfigError(f"{source}: '{key}' is true; this benchmark's Llama has no biases")
        act = doc.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act '{act}'; the MLP here is SwiGLU (silu)")
        self.rope_scaling = doc.get("rope_scaling")

    def describe(self):
        return (f"{self.layers} layers, hidden {self.hidden}, heads {self.heads}/{self.kv_heads} "
                f"x {self.head_dim}, intermediate {self.intermediate}, vocabulary {self.vocab}, "
                f"{'tied' if self.tied else 'untied'} LM head")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, weight initialised to 1."""

    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Causal GQA attention with RoPE, Hugging Face's LlamaAttention in torch ops."""

    def __init__(self, s):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, s.head_dim
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        if rep > 1:  # kv head j serves query heads j*rep .. j*rep+rep-1
            k = k[:, :, None].expand(b, self.kv_heads, rep, t, self.head_dim).reshape(
                b, self.heads, t, self.head_dim)
            v = v[:, :, None].expand(b, self.kv_heads, rep, t, self.head_dim).reshape(
                b, self.heads, t, self.head_dim)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
        out = torch.softmax(scores, dim=-1) @ v  # [B, heads, T, d]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Mlp(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, s):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, s):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = Mlp(s)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """LlamaForCausalLM's layout; forward returns the mean cross-entropy over all B*T targets."""

    def __init__(self, s, tokens):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.eps)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)
        if s.tied:
            self.lm_head.weight = self.embed_tokens.weight
        # RoPE tables and the causal mask for T positions, computed once (no parameters).
        inv_freq = 1.0 / (s.theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        angle = torch.arange(tokens, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angle = torch.cat((angle, angle), dim=-1)  # [T, d]
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)
        self.register_buffer("mask", torch.full((tokens, tokens), float("-inf")).triu(1), persistent=False)

    def forward(self, inputs, targets):
        x = self.embed_tokens(inputs)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin, self.mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(shape, tokens):
    """The model with normal(0, 0.02) weights (every Linear and the embedding), norms 1."""
    torch.manual_seed(WEIGHT_SEED)
    model = Llama(shape, tokens)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, INIT_STD)
    return model


def count_parameters(model, shape):
    """(every trained tensor's elements, a tied tensor once; the same without the embedding)."""
    total = sum(p.numel() for p in model.parameters())
    return total, total - shape.vocab * shape.hidden


def make_batches(steps, batch, tokens, vocab):
    """Random ids [steps, B, T+1], the same for any rank count."""
    g = torch.Generator().manual_seed(DATA_SEED)
    return torch.randint(0, vocab, (steps, batch, tokens + 1), generator=g, dtype=torch.int64)


def train_loop(model, params, batches, args):
    """Runs every step; returns (per-step seconds, per-step losses as tensors)."""
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                                  weight_decay=args.weight_decay)
    seconds, losses = [], []
    for rows in batches:
        inputs, targets = rows[:, :-1], rows[:, 1:]
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        optimizer.step()
        seconds.append(time.perf_counter() - t0)
        losses.append(loss.detach())
    return seconds, losses


def gemm_ceiling(m, k, n, repeats):
    """Median seconds of torch.mm([m, k], [k, n]) fp32 after 3 warm-ups."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    for _ in range(3):
        torch.mm(a, b)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def ddp_worker(rank, world, port, shape, args, results):
    """One rank: its share of each global batch, the model in DistributedDataParallel."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = build_model(shape, args.tokens)
        ddp = DistributedDataParallel(model)
        per_rank = args.batch // world
        batches = make_batches(args.steps, args.batch, args.tokens, shape.vocab)
        batches = batches[:, rank * per_rank:(rank + 1) * per_rank]
        seconds, losses = train_loop(ddp, list(model.parameters()), batches, args)
        # Each rank's loss is the mean over its share; the global loss is their mean.
        loss = torch.stack(losses) / world
        dist.all_reduce(loss)
        if rank == 0:
            results.put((seconds, loss.tolist()))
    finally:
        dist.destroy_process_group()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(shape, args):
    """Spawns --ddp ranks; returns rank 0's (seconds, losses)."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=ddp_worker, args=(r, args.ddp, port, shape, args, results))
             for r in range(args.ddp)]
    for p in procs:
        p.start()
    result = None
    while result is None:
        try:
            result = results.get(timeout=1.0)
        except queue.Empty:  # has a rank failed?
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed or all(p.exitcode is not None for p in procs):
                for p in procs:
                    if p.is_alive():
                        p.terminate()
                codes = ", ".join(str(p.exitcode) for p in procs)
                raise RuntimeError(f"a DDP rank failed (exit statuses {codes})")
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a DDP rank exited with status {p.exitcode}")
    return result


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="a Hugging Face Llama config.json (or the folder holding it)")
    parser.add_argument("--batch", type=int, default=4, metavar="B",
                        help="sequences per step, the global batch under --ddp (default 4)")
    parser.add_argument("--tokens", type=int, default=128, metavar="T",
                        help="tokens per sequence (default 128)")
    parser.add_argument("--steps", type=int, default=10, metavar="N",
                        help="steps run, warm-up included (default 10; 0 with --gemm-ceiling: "
                             "the GEMM alone)")
    parser.add_argument("--warmup", type=int, default=3, metavar="W",
                        help="first steps not counted in the timing (default 3)")
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW's learning rate (default 3e-4)")
    parser.add_argument("--weight-decay", type=float, default=0.1,
                        help="AdamW's decoupled weight decay (default 0.1)")
    parser.add_argument("--beta1", type=float, default=0.9, help="AdamW's beta1 (default 0.9)")
    parser.add_argument("--beta2", type=float, default=0.999, help="AdamW's beta2 (default 0.999)")
    parser.add_argument("--eps", type=float, default=1e-8, help="AdamW's eps (default 1e-8)")
    parser.add_argument("--clip", type=float, default=1.0,
                        help="clip_grad_norm_ to this global 2-norm; 0: no clipping (default 1.0)")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="torch.set_num_threads, per rank under --ddp (default 1); OpenBLAS's "
                             "threads are OPENBLAS_NUM_THREADS's, set by the caller")
    parser.add_argument("--ddp", type=int, default=0, metavar="R",
                        help="R ranks in DistributedDataParallel over gloo (default: one process, "
                             "no DDP); R must divide --batch")
    parser.add_argument("--gemm-ceiling", action="store_true",
                        help="also time torch.mm [B*T, hidden] x [hidden, intermediate] fp32")
    parser.add_argument("--gemm-repeats", type=int, default=30, metavar="N",
                        help="timed GEMMs for --gemm-ceiling (default 30)")
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE as JSON")
    args = parser.parse_args()
    for name in ("batch", "tokens", "threads", "gemm_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup} is negative")
    if args.steps == 0 and not args.gemm_ceiling:
        parser.error("--steps 0 runs no step; it is only for --gemm-ceiling alone")
    if args.steps != 0 and args.steps <= args.warmup:
        parser.error(f"--steps {args.steps} leaves no timed step after --warmup {args.warmup}")
    if args.ddp < 0:
        parser.error(f"--ddp {args.ddp} is negative")
    if args.ddp and args.batch % args.ddp:
        parser.error(f"--ddp {args.ddp} does not divide --batch {args.batch}: each rank takes an "
                     f"equal share of the global batch")
    if args.clip < 0:
        parser.error(f"--clip {args.clip} is negative")
    return args


def load_shape(path):
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read --config '{path}': {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--config '{path}' is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"--config '{path}' is not a JSON object")
    return LlamaShape(doc, path), path


def main():
    args = parse_args()
    try:
        shape, config_path = load_shape(args.config)
    except ConfigError as e:
        print(f"train_torch: error: {e}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    setting = (f"OPENBLAS_NUM_THREADS={blas}, set_num_threads({args.threads})"
               + (f", DDP gloo {args.ddp} ranks" if args.ddp else ", one process"))
    tokens_per_step = args.batch * args.tokens
    result = {"config": config_path, "batch": args.batch, "tokens": args.tokens,
              "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
              "ddp_ranks": args.ddp, "openblas_num_threads": blas,
              "torch_version": torch.__version__}
    print(f"torch train: {config_path}: {shape.describe()}")
    if shape.rope_scaling:
        print("note: rope_scaling is ignored (it changes the rotation frequencies, not the work)")
    print(f"setting: {setting}; batch {args.batch} x {args.tokens} tokens ({tokens_per_step} a step)"
          + (f", {args.batch // args.ddp} sequences per rank" if args.ddp else ""))

    if args.steps > 0:
        model = build_model(shape, args.tokens)
        params, without_embedding = count_parameters(model, shape)
        try:
            if args.ddp:
                del model
                seconds, losses = run_ddp(shape, args)
            else:
                batches = make_batches(args.steps, args.batch, args.tokens, shape.vocab)
                seconds, losses = train_loop(model, list(model.parameters()), batches, args)
                losses = [float(x) for x in losses]
        except RuntimeError as e:
            print(f"train_torch: error: {e}", file=sys.stderr)
            return 1
        timed = seconds[args.warmup:]
        median, mean = statistics.median(timed), statistics.mean(timed)
        tokens_per_second = tokens_per_step / median
        flops = 6.0 * params * tokens_per_second
        print(f"parameters: {params} ({params / 1e6:.2f} M), embedding table counted"
              + (" (tied: it is also the LM head)" if shape.tied else "")
              + f"; {without_embedding} ({without_embedding / 1e6:.2f} M) without it")
        print(f"loss: {losses[0]:.4f} at step 1 -> {losses[-1]:.4f} at step {len(losses)}")
        print(f"median step: {median * 1e3:.1f} ms ({len(timed)} timed steps after {args.warmup} "
              f"warm-up)")
        print(f"mean step: {mean * 1e3:.1f} ms")
        print(f"tokens/s: {tokens_per_second:.0f} (B*T / median step)")
        print(f"model FLOP/s: {flops / 1e9:.2f} GFLOP/s (6 x {params} parameters x tokens/s)")
        result.update({"parameters": params, "parameters_without_embedding": without_embedding,
                       "embedding_counted": True, "step_seconds": seconds,
                       "median_step_seconds": median, "mean_step_seconds": mean,
                       "tokens_per_second": tokens_per_second, "model_flops_per_second": flops,
                       "losses": losses})

    if args.gemm_ceiling:
        m, k, n = tokens_per_step, shape.hidden, shape.intermediate
        median = gemm_ceiling(m, k, n, args.gemm_repeats)
        gflops = 2.0 * m * n * k / median / 1e9
        print(f"GEMM ceiling: torch.mm [{m}, {k}] x [{k}, {n}] fp32: median {median * 1e3:.3f} ms, "
              f"{gflops:.1f} GFLOP/s (OPENBLAS_NUM_THREADS={blas}, set_num_threads({args.threads}))")
        result["gemm"] = {"m": m, "k": k, "n": n, "repeats": args.gemm_repeats,
                          "median_seconds": median, "gflops": gflops}
        if args.steps > 0:
            print(f"fraction of the GEMM ceiling: {result['model_flops_per_second'] / 1e9 / gflops:.3f}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
