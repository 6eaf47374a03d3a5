"""The stop flag the loop shares with its engine worker process: which requests to stop.

The flag holds the id of the newest request to stop, so an abort names the request it is for
and is never cleared away (:class:`AbortFlag`). :mod:`robot_latency.planner.worker` owns one
per worker. Beside it, the tokens out of the generation in flight, written by the worker as
they come (:meth:`_RequestAbort.note_tokens`, through :func:`robot_latency.engines.base.
note_tokens`) and read by the loop's side while it runs (an action's feedback).
"""

from __future__ import annotations

import ctypes
from multiprocessing.context import BaseContext
from typing import Any


class AbortFlag:
    """Which requests to stop, shared with the worker process, read without a lock.

    ``multiprocessing.Event`` takes a cross-process semaphore on every ``is_set()``; llama.cpp's
    abort callback asks hundreds of times per token, and a loop that must ``set()`` the flag
    while the (niced) worker is preempted holding that semaphore waits for the worker to be
    scheduled again: a priority inversion in the loop's most time-critical step. One shared
    integer needs no lock: aligned stores by the parent (its writers hold the runner's lock),
    and a reader that only needs to see the store eventually (microseconds on one machine).

    The value is the id of the newest request to stop; every request up to it stops. It only
    grows, so no abort is ever cleared away: one asked for a request not sent yet (the worker
    still finishing an earlier one) stops that request as it starts.
    """

    ALL = 2 ** 62  # set(): every request

    def __init__(self, ctx: BaseContext) -> None:
        self._value = ctx.RawValue(ctypes.c_longlong, 0)
        # tokens out of the request in flight: one aligned 64-bit word, one writer (the worker)
        self._tokens = ctx.RawValue(ctypes.c_longlong, 0)

    def stop(self, request_id: int) -> None:
        """Stop request ``request_id`` and every earlier one, now or when it starts."""
        self._value.value = max(self._value.value, request_id)

    def set(self) -> None:
        self.stop(self.ALL)

    def clear(self) -> None:
        self._value.value = 0

    def is_set(self) -> bool:
        """Whether any stop is stored."""
        return self._value.value > 0

    def for_request(self, request_id: int) -> _RequestAbort:
        """Request ``request_id``'s abort signal (what its engine polls; it counts the request's
        tokens too)."""
        return _RequestAbort(self._value, request_id, self._tokens)

    def reset_tokens(self) -> None:
        """Zero the token count (before a request is sent; the worker is free then)."""
        self._tokens.value = 0

    @property
    def tokens(self) -> int:
        """Tokens out so far of the request in flight."""
        return int(self._tokens.value)


class _RequestAbort:
    """One request's abort signal: set once the flag's value reaches the request's id."""

    def __init__(self, value: Any, request_id: int, tokens: Any = None) -> None:
        self._value, self.request_id, self._tokens = value, request_id, tokens

    def is_set(self) -> bool:
        return bool(self._value.value >= self.request_id)

    def note_tokens(self, tokens: int) -> None:
        """The engine's count of the tokens it generated so far for this request."""
        if self._tokens is not None:
            self._tokens.value = tokens
