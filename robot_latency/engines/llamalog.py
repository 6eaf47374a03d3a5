"""llama.cpp's own log lines, routed to the project's logger at debug level.

llama.cpp reports through one process-wide callback (``llama_log_set``). llama-cpp-python installs
its own on import (``llama_cpp._logger``), which prints to stderr whatever passes its level:
lines such as "decode: removing memory module entries ..." or the ``n_ctx_seq`` warning then
land on the user's terminal in the middle of a run. :func:`route_llama_log` replaces that callback
with one that hands each complete line to :data:`LOGGER_NAME` at DEBUG, so they show only when the
user asks for debug logging (``--verbose``).

The callback is per process: the CLI calls this once, and the engine worker process calls it
again before it loads a model (:mod:`robot_latency.planner.worker`).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

#: The logger llama.cpp's lines go to (at DEBUG).
LOGGER_NAME = "robot_latency.llama_cpp"

log = logging.getLogger(LOGGER_NAME)

_lock = threading.Lock()
_partial: list[str] = []  # a line llama.cpp sent in pieces, until its newline comes
_callback: Any = None  # the installed ctypes callback: kept alive as long as llama.cpp holds it


def _on_log(level: int, text: bytes | None, user_data: ctypes.c_void_p) -> None:
    """Collect llama.cpp's text and log each complete line (ggml's level is not kept: a warning
    about the context size is as much debug detail here as a tensor-loading note)."""
    if not text:
        return
    chunk = text.decode("utf-8", errors="replace")
    with _lock:
        _partial.append(chunk)
        if "\n" not in chunk:
            return
        *lines, rest = "".join(_partial).split("\n")
        _partial[:] = [rest] if rest else []
    for line in lines:
        if line.strip() and line.strip() != ".":  # model loading prints progress dots
            log.debug("%s", line.rstrip())


def route_llama_log() -> None:
    """Send llama.cpp's log lines to :data:`LOGGER_NAME` at DEBUG instead of stderr (idempotent).

    Imports llama_cpp first, so that its own callback (installed on import) is the one replaced.
    """
    global _callback
    import llama_cpp

    with _lock:
        if _callback is None:
            _callback = llama_cpp.llama_log_callback(_on_log)
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def route_mtmd_log() -> None:
    """The same for ``libmtmd`` (the vision encoder's loader and helpers), which has callbacks of
    its own: its lines (every tensor of an mmproj, each image batch) go to :data:`LOGGER_NAME`."""
    from llama_cpp import mtmd_cpp

    route_llama_log()
    with _lock:
        mtmd_cpp.mtmd_log_set(_callback, ctypes.c_void_p(0))
        mtmd_cpp.mtmd_helper_log_set(_callback, ctypes.c_void_p(0))
