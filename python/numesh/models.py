"""Models from Python: CausalLM (from_pretrained, logits, generate, stream) and Tokenizer."""

from __future__ import annotations

import queue
import threading
from typing import Iterator

from numesh._numesh import CausalLM, Tokenizer

_DONE = object()


def _stream(self: CausalLM, prompt, **options) -> Iterator[int]:
    """generate(), as an iterator of the token ids as they come (the model runs on a thread of
    its own; breaking out of the loop lets it finish the tokens it is on)."""
    if "on_token" in options:
        raise TypeError("stream() takes no on_token: it yields the tokens itself")
    tokens: queue.Queue = queue.Queue()
    failure = []

    def run():
        try:
            self.generate(prompt, on_token=tokens.put, **options)
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            failure.append(e)
        finally:
            tokens.put(_DONE)

    worker = threading.Thread(target=run, name="numesh-generate", daemon=True)
    worker.start()
    while True:
        token = tokens.get()
        if token is _DONE:
            break
        yield token
    worker.join()
    if failure:
        raise failure[0]


CausalLM.stream = _stream

__all__ = ["CausalLM", "Tokenizer"]
