#!/usr/bin/python3
"""numesh's GGUF files in llama.cpp itself.

    llama_cpp_check.py NUMESH WORK_DIR [NAME.TYPE.gguf ...]

For each architecture numesh writes to GGUF (a tiny random checkpoint of hf_model_check.py's
models: Llama with Llama 3.1's RoPE scaling and tied embeddings, Llama with MLP biases, Qwen2,
Qwen3, Mixtral's experts in a llama file, Qwen2-MoE with its shared expert, Qwen3-MoE, Gemma and
Phi-3), beside a byte-level BPE tokenizer.json and a chat template written here, `numesh convert`
writes the model in each --type the rows allow (f32, f16, bf16, q8_0, q4_0; q5_0 and iq4_nl for three). Then llama.cpp
(tests/models/llama_cpp_check/run.mjs: node-llama-cpp's binding to llama.cpp's prebuilt CPU
libraries) loads each file, takes NEW_TOKENS greedy tokens after a random prompt and encodes a
text; `numesh generate` takes its greedy tokens from the same file (and writes its logits), and
`numesh tokenize` encodes the same text from the file's metadata. Each file must:
- load in llama.cpp, under the architecture numesh wrote;
- give llama.cpp's greedy tokens: the two agree token for token, or part at a step where
  numesh's logits for the two tokens are within the format's bound of each other (BOUNDS,
  relative to the row's largest |logit|: the two engines round differently, llama.cpp rounding
  each projection's input to the weights' f16 or bf16, or to 8-bit blocks, and a near tie can tip
  either way; after that the two texts differ and nothing more is compared);
- give the ids numesh's tokenizer gives, and carry the chat template as written.
GGUF files named after WORK_DIR (NAME.TYPE.gguf, written by `numesh convert` elsewhere: the CLI
tests' Llama beside a trained SentencePiece model) are checked the same way, less the template,
and encode TEXT with single spaces: that model sets SentencePiece's remove_extra_whitespaces
(tokenizer.ggml.remove_extra_whitespaces), which numesh follows as the SentencePiece library
does and llama.cpp's SentencePiece path ignores (real Llama 2 and Mistral models leave it off).
Exit status: 0 all agree; 1 a difference or a file llama.cpp refuses; 77 a dependency missing
when NUMESH_SKIP_LLAMA_CPP_CHECKS=1 (llama.cpp's package) or NUMESH_SKIP_TORCH_CHECKS=1 (torch),
a reported skip; 2 a dependency missing otherwise, naming what to install.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "common"))


def missing(what, variable, how):
    """Exits 77 (a skip) when `variable` is 1, else 2, naming what to install."""
    skip = os.environ.get(variable) == "1"
    print(f"llama_cpp_check: {'skipped: ' if skip else ''}{what} is missing; {how}"
          f"{f' ({variable}=1)' if skip else f', or set {variable}=1 to report this check as skipped'}")
    sys.exit(77 if skip else 2)


try:
    import numpy as np
    import torch
    import hf_model_check as hf
    from byte_level_tokenizer import byte_level_tokenizer
except ImportError as e:
    missing(f"the Python module {e.name}", "NUMESH_SKIP_TORCH_CHECKS",
            "install Debian's python3-numpy and PyTorch for /usr/bin/python3")

PACKAGE = os.path.join(HERE, "llama_cpp_check")
PROMPT, NEW_TOKENS = 8, 12
TEXT = "Hello, world! numesh's 3 GGUF files: qwen2, llama & gemma.\n  done"
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# numesh's fp32 forward against llama.cpp's: f16 and bf16 weights (llama.cpp rounds each
# projection's input to the weights' type, numesh to bf16 for bf16 weights only), blocks (both
# quantize the inputs to 8 bits a block of 32 from slightly different fp32 values).
BOUNDS = {"f32": 1e-3, "f16": 1e-2, "bf16": 2e-2, "q8_0": 3e-2, "q4_0": 3e-2, "q5_0": 3e-2, "iq4_nl": 3e-2}
FLOATS = ["f32", "f16", "bf16"]
BLOCKS = FLOATS + ["q8_0", "q4_0"]
WITH_Q5_0 = BLOCKS + ["q5_0", "iq4_nl"]


def cases():
    """(name, config, --type list): hf_model_check's models whose rows suit each type."""
    by_name = {name: c for name, c, *_ in hf.models()}
    qwen2_moe = dict(by_name["qwen2_moe_blocks"], mlp_only_layers=[])  # llama.cpp: every layer MoE
    return [("llama_tied_f32", by_name["llama_tied_f32"], FLOATS),  # Llama 3.1 scaling: rope_freqs
            ("llama_blocks", by_name["llama_blocks"], WITH_Q5_0),   # untied, Q/K permuted
            ("llama_mlp_bias_f32", by_name["llama_mlp_bias_f32"], FLOATS),
            ("qwen2_tied_blocks", by_name["qwen2_tied_blocks"], WITH_Q5_0),
            ("qwen3_blocks", by_name["qwen3_blocks"], BLOCKS),
            ("mixtral_blocks", by_name["mixtral_blocks"], WITH_Q5_0),
            ("qwen2_moe_blocks", qwen2_moe, BLOCKS),
            ("qwen3_moe_f32", by_name["qwen3_moe_f32"], FLOATS),
            ("gemma_blocks", by_name["gemma_blocks"], BLOCKS),
            ("phi3_blocks", by_name["phi3_blocks"], BLOCKS)]


def run(*args):
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def write(numesh, work):
    """The checkpoints, their GGUF files and the jobs for llama.cpp; returns the runs to compare."""
    runs = []
    for i, (name, c, types) in enumerate(cases()):
        c = dict(c, vocab_size=272)  # the tokenizer's 256 bytes, 8 merges, 4 specials; 4 unused
        folder = os.path.join(work, name)
        hf.save(folder, c, hf.weights(c, torch.float32, 3000 + i), 1)
        with open(os.path.join(folder, "tokenizer.json"), "w") as out:
            json.dump(byte_level_tokenizer(c["vocab_size"]), out)
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as out:
            json.dump({"chat_template": TEMPLATE}, out)
        prompt = torch.randint(3, 256, (PROMPT,), generator=torch.Generator().manual_seed(90 + i)).tolist()
        for t in types:
            file = os.path.join(work, f"{name}.{t}.gguf")
            run(numesh, "convert", "--model", folder, "--out", file, "--type", t, "--quiet")
            runs.append({"name": name, "type": t, "file": file, "prompt": prompt,
                         "template": TEMPLATE, "text": TEXT,
                         "architecture": "llama" if c["model_type"] == "mixtral" else c["model_type"].replace("_", "")})
    return runs


def numesh_side(numesh, r):
    """numesh's greedy tokens and logits from the file, and its ids for the run's text."""
    stem = r["file"][:-len(".gguf")]
    run(numesh, "generate", "--model", r["file"], "--ids", ",".join(map(str, r["prompt"])),
        "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos", "--quiet", "--json", stem + ".json",
        "--logits-out", stem + ".npy")
    with open(stem + ".json") as f:
        ids = json.load(f)["sequences"][0]["ids"]
    tokenized = json.loads(run(numesh, "tokenize", "--model", r["file"], "--text", r["text"], "--no-special", "--json"))
    return ids, np.load(stem + ".npy").astype(np.float64), tokenized["ids"]


def compare_greedy(ours, theirs, logits, bound):
    """(agreeing tokens, whether any parting is a near tie of numesh's logits)."""
    for step, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            row = logits[PROMPT - 1 + step]
            return step, bool(abs(row[a] - row[b]) <= bound * np.abs(row).max())
    return min(len(ours), len(theirs)), len(ours) == len(theirs) == NEW_TOKENS


def main(numesh, work, others):
    if not os.path.isdir(os.path.join(PACKAGE, "node_modules", "node-llama-cpp")):
        missing("llama.cpp's package (node-llama-cpp)", "NUMESH_SKIP_LLAMA_CPP_CHECKS",
                "run `npm install --omit=optional --ignore-scripts` in tests/models/llama_cpp_check "
                "(scripts/test.sh does on x86-64)")
    os.makedirs(work, exist_ok=True)
    runs = write(numesh, work)
    for file in others:
        name, t = os.path.basename(file)[:-len(".gguf")].rsplit(".", 1)
        prompt = torch.randint(3, 256, (PROMPT,), generator=torch.Generator().manual_seed(len(runs))).tolist()
        runs.append({"name": name, "type": t, "file": file, "prompt": prompt, "architecture": "llama",
                     "template": None, "text": TEXT.replace("  ", " ")})
    jobs = os.path.join(work, "jobs.json")
    with open(jobs, "w") as out:
        json.dump({"jobs": [{"file": r["file"], "prompt": r["prompt"], "new_tokens": NEW_TOKENS, "text": r["text"]}
                             for r in runs]}, out)
    results_file = os.path.join(work, "llama_cpp.json")
    done = subprocess.run(["node", os.path.join(PACKAGE, "run.mjs"), jobs, results_file])
    if done.returncode == 77:
        missing("llama.cpp's package (node-llama-cpp)", "NUMESH_SKIP_LLAMA_CPP_CHECKS",
                "run `npm install --omit=optional --ignore-scripts` in tests/models/llama_cpp_check")
    if done.returncode != 0:
        print(f"llama_cpp_check: run.mjs exited with {done.returncode}")
        return 1
    with open(results_file) as f:
        theirs = json.load(f)
    print(f"llama_cpp_check: llama.cpp {theirs['llama_cpp']} (node-llama-cpp's prebuilt CPU libraries)")
    failed = 0
    whole = 0
    for r, t in zip(runs, theirs["results"]):
        label = f"{r['name']}.{r['type']}.gguf"
        if "error" in t:
            failed += 1
            print(f"FAIL {label:32s} llama.cpp refuses it: {t['error']}")
            continue
        ids, logits, tokenized = numesh_side(numesh, r)
        agree, ok = compare_greedy(ids, t["ids"], logits, BOUNDS[r["type"]])
        whole += agree == NEW_TOKENS
        problems = []
        if not ok:
            problems.append("greedy tokens part where numesh's logits are no near tie")
        if t["architecture"] != r["architecture"]:
            problems.append(f"architecture {t['architecture']}, expected {r['architecture']}")
        if t["tokenized"] != tokenized:
            problems.append(f"llama.cpp encodes the text as {t['tokenized']}, numesh as {tokenized}")
        if t["chat_template"] != r["template"]:
            problems.append(f"chat template {t['chat_template']!r}")
        failed += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {label:32s} greedy numesh {ids} llama.cpp {t['ids']}: "
              f"{agree} of {NEW_TOKENS} agree{'' if agree == NEW_TOKENS else ', then a near tie' if ok else ''}; "
              f"{len(tokenized)} text ids {'same' if t['tokenized'] == tokenized else 'differ'}"
              f"{'; ' + '; '.join(problems) if problems else ''}")
    if failed:
        print(f"llama_cpp_check: {failed} of {len(runs)} files differ in llama.cpp")
        return 1
    print(f"llama_cpp_check: all {len(runs)} files load in llama.cpp and give its greedy tokens "
          f"({whole} token for token, {len(runs) - whole} to a near tie)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print("usage: llama_cpp_check.py NUMESH WORK_DIR [NAME.TYPE.gguf ...]")
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
