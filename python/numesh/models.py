"""Models from Python: CausalLM (from_pretrained, logits, generate, stream) and Tokenizer."""

from __future__ import annotations

import queue
import threading
from typing import Iterator

from numesh._numesh import CausalLM, Tokenizer

_DONE = object()


class _Stopped(Exception):
    """Ends the worker's generate() when the consumer has stopped reading."""


def _stream(self: CausalLM, prompt, **options) -> Iterator[int]:
    """generate(), as an iterator of the token ids as they come. The model runs on a thread of
    its own; when the loop ends early (break, an exception, Ctrl-C in the consumer), it stops
    at the end of the token it is on."""
    if "on_token" in options:
        raise TypeError("stream() takes no on_token: it yields the tokens itself")
    tokens: queue.Queue = queue.Queue()
    failure = []
    stop = threading.Event()

    def on_token(token):
        if stop.is_set():
            raise _Stopped
        tokens.put(token)

    def run():
        try:
            self.generate(prompt, on_token=on_token, **options)
        except _Stopped:
            pass
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            failure.append(e)
        finally:
            tokens.put(_DONE)

    worker = threading.Thread(target=run, name="numesh-generate", daemon=True)
    worker.start()
    try:
        while True:
            token = tokens.get()
            if token is _DONE:
                break
            yield token
    finally:
        stop.set()
        worker.join()
    if failure:
        raise failure[0]


CausalLM.stream = _stream

__all__ = ["CausalLM", "Tokenizer"]
