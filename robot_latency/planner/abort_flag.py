"""The stop flag and token count the loop's side shares with the engine worker process."""

from __future__ import annotations

import ctypes
from multiprocessing.context import BaseContext


class AbortFlag:
    """A stop flag shared with the worker process, read and written without a lock.

    ``multiprocessing.Event`` takes a cross-process semaphore on every ``is_set()``; llama.cpp's
    abort callback asks hundreds of times per token, and a loop that must ``set()`` the flag
    while the (niced) worker is preempted holding that semaphore waits for the worker to be
    scheduled again: a priority inversion in the loop's most time-critical step. One shared
    byte needs no lock: a single writer (the loop), aligned byte stores, and readers that only
    need to see the store eventually (within microseconds on one machine).
    """

    def __init__(self, ctx: BaseContext) -> None:
        self._value = ctx.RawValue(ctypes.c_bool, False)
        # tokens out of the generation in progress: written by the worker, read by the loop's
        # side (one aligned 64-bit word, one writer, as the flag)
        self._tokens = ctx.RawValue(ctypes.c_int64, 0)

    def set(self) -> None:
        self._value.value = True

    def clear(self) -> None:
        """Unset the flag and zero the token count (before each request)."""
        self._value.value = False
        self._tokens.value = 0

    def is_set(self) -> bool:
        return bool(self._value.value)

    def note_tokens(self, tokens: int) -> None:
        self._tokens.value = tokens

    @property
    def tokens(self) -> int:
        return int(self._tokens.value)
