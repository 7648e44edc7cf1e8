"""A small byte-level BPE tokenizer.json for tests that need a tokenizer beside a tiny model:
numesh convert names its pre-tokenizer (Qwen2's regex: llama.cpp's 'qwen2'), so GGUF files carry
it, and every text encodes (the 256 bytes are all tokens)."""


def byte_level_tokenizer(vocab_size, extras=True):
    """A byte-level BPE tokenizer.json of the 256 bytes (GPT-2's byte-to-character map) and, with
    `extras`, a few merges and four special tokens, split by Qwen2's regex (llama.cpp's
    pre-tokenizer 'qwen2'). The special tokens are those of Phi-3's tokenizer: llama.cpp looks
    them up by name in any file whose general.name says Phi-3, and refuses one without them."""
    chars = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    shifted = 0
    to_char = {}
    for b in range(256):
        if b in chars:
            to_char[b] = chr(b)
        else:
            to_char[b] = chr(256 + shifted)
            shifted += 1
    vocab = {to_char[b]: b for b in range(256)}
    merges = [["Ġ", "w"], ["o", "r"], ["e", "l"], ["el", "l"], ["ell", "o"], ["Ġw", "or"], ["l", "d"],
              ["Ġwor", "ld"]] if extras else []
    for a, b in merges:
        vocab[a + b] = len(vocab)
    special = [{"id": len(vocab) + i, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": True}
               for i, content in enumerate(["<unk>", "<s>", "</s>", "<|endoftext|>"] if extras else [])]
    assert vocab_size >= len(vocab) + len(special)
    regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": False},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges}}
