#!/usr/bin/python3
"""Checks numesh's SentencePiece tokenizer (TextTokenizer on a tokenizer.model) against the
SentencePiece library's Python binding, id for id and character for character.

    sentencepiece_check.py write DIR   # trains a model, writes its ids and texts for the corpus
    sentencepiece_check.py check DIR   # compares what sentencepiece_check_main produced

`write` trains a small BPE model with Debian's python3-sentencepiece on a text made of the
tokenizer corpus (tokenizer_corpus.json: English, code, numbers, whitespace runs, CJK, RTL,
emoji with joiners, combining marks), with byte fallback as Llama 2's model has it, and saves
DIR/tokenizer.model and DIR/expected.json: for every corpus text, BOS then sp.encode(text), and
sp.decode of those ids. sentencepiece_check_main encodes and decodes the same texts through
numesh; `check` wants the same ids and the same text.
Exit status: 0 all identical; 1 a difference (the first few printed); 2 the module is missing
(77 with NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
spm = require("sentencepiece")

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_corpus.json")


def training_text(d):
    """DIR/training.txt, the corpus's non-empty lines 20 times over; returns (its path, the texts)."""
    with open(CORPUS, encoding="utf-8") as f:
        texts = json.load(f)
    training = os.path.join(d, "training.txt")
    with open(training, "w", encoding="utf-8") as f:
        for _ in range(20):
            for t in texts:
                for line in t.splitlines():
                    if line.strip():
                        f.write(line + "\n")
    return training, texts


def write(d):
    training, texts = training_text(d)
    spm.SentencePieceTrainer.train(input=training, model_prefix=os.path.join(d, "tokenizer"), vocab_size=1000,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
    expected = []
    for t in texts:
        ids = [sp.bos_id()] + sp.encode(t)
        expected.append({"text": t, "ids": ids, "decoded": sp.decode(ids)})
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


def check(d):
    with open(os.path.join(d, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)
    with open(os.path.join(d, "numesh.json"), encoding="utf-8") as f:
        got = json.load(f)
    bad = [(e, g) for e, g in zip(expected, got) if e["ids"] != g["ids"] or e["decoded"] != g["decoded"]]
    for e, g in bad[:5]:
        print(f"DIFFERENT: {e['text']!r}: ids {g['ids']} (SentencePiece {e['ids']}), "
              f"text {g['decoded']!r} (SentencePiece {e['decoded']!r})")
    if bad or len(got) != len(expected):
        print(f"sentencepiece_check: {len(bad)} of {len(expected)} texts differ")
        return 1
    print(f"sentencepiece_check: {len(expected)} texts: ids and decoded text identical to SentencePiece's")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: sentencepiece_check.py write|check DIR")
        sys.exit(2)
    if sys.argv[1] == "write":
        write(sys.argv[2])
        sys.exit(0)
    sys.exit(check(sys.argv[2]))
