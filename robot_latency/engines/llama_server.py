"""llama-cpp-python's OpenAI-compatible server on loopback, for the tests and the benchmarks.

``python -m llama_cpp.server`` (the ``llama-cpp-python[server]`` extras, started through
:mod:`robot_latency.engines.llama_serve` so that it loads with this CPU's extra-buffer-type
policy) serving one GGUF on
127.0.0.1 at a free port, started and waited for, and always ended (a context manager). It runs
one generation at a time (docs/REFERENCE.md, "Offboard serving and fleets"), so it is started with
``--interrupt_requests false``: its default ends the stream in progress whenever another request
arrives, which would cut one robot's plan short for another's. And with ``--logits_all false``:
its default keeps the logits of every prompt token (for ``logprobs``), which computes the output
layer over the whole vocabulary for each of them; on the inflated 0.5B planner that made the
server's prompt evaluation 1.5-2x slower than the same model's in-process (docs/BENCHMARKS.md,
"Offboard").
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from robot_latency.errors import RobotLatencyError
from robot_latency.lifetime import popen

log = logging.getLogger(__name__)


class LocalServerError(RobotLatencyError):
    """The server could not start; the message holds the end of its log."""


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """llama-cpp-python's server for ``model_path`` on 127.0.0.1 (a context manager).

    Args:
        model_path: the GGUF to serve.
        port: the port (0: a free one).
        n_ctx: the context length.
        n_threads: decode threads (0: llama-cpp-python's default).
        log_path: where the server's output goes (None: a temporary file beside the model's
            run; read it with :meth:`log_text`).
        ready_timeout_s: how long it may take to load and answer ``GET /v1/models``.
        extra_args: further command-line arguments.
        cpus: the cores the server may run on (None: any); a benchmark gives the server cores of
            its own, as if it were another machine.
        extra_bufts: llama.cpp's extra buffer types in the server (auto: off where the loaded
            llama.cpp has AMX kernels; :mod:`robot_latency.engines.llama_serve`).
    """

    def __init__(self, model_path: str | Path, *, port: int = 0, n_ctx: int = 1024,
                 n_threads: int = 0, log_path: str | Path | None = None,
                 ready_timeout_s: float = 120.0, extra_args: tuple[str, ...] = (),
                 cpus: frozenset[int] | None = None, extra_bufts: str = "auto") -> None:
        self.model_path = Path(model_path)
        self.extra_bufts = extra_bufts
        self.port = port or free_port()
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = tuple(extra_args)
        self.cpus = cpus
        self.log_path = Path(log_path) if log_path else None
        self._log: IO[Any] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        """The OpenAI base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        """The server's command line."""
        cmd = [sys.executable, "-m", "robot_latency.engines.llama_serve", "--extra_bufts",
               self.extra_bufts, "--model", str(self.model_path),
               "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
               "--interrupt_requests", "false", "--logits_all", "false", "--verbose", "true"]
        if self.n_threads:
            cmd += ["--n_threads", str(self.n_threads), "--n_threads_batch",
                    str(self.n_threads)]
        return cmd + list(self.extra_args)

    @property
    def running(self) -> bool:
        """The server process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> LocalServer:
        """Start the server and wait until it answers; a running server is returned as it is.

        The server dies with this process, however this process ends
        (:mod:`robot_latency.lifetime`).

        Raises:
            LocalServerError: it exited or did not answer in time (with its log's end).
        """
        import httpx

        if self.running:
            return self
        if not self.model_path.is_file():
            raise LocalServerError(f"local server: model {self.model_path}: no such file")
        if self.log_path is None:
            import tempfile

            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self._log = open(self.log_path, "ab")
        cpus = self.cpus
        # Set before exec, so every thread the server starts inherits it.
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=pin)
        self.starts += 1
        end = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self._close_log()
                raise LocalServerError(f"local server exited with {self.proc.returncode}: "
                                       f"{self.log_tail()}")
            try:
                if httpx.get(self.url + "/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise LocalServerError(f"local server on port {self.port} did not answer within "
                               f"{self.ready_timeout_s:g} s: {self.log_tail()}")

    def stop(self) -> None:
        """Kill the server (its whole process group) and wait for it (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self._close_log()

    def restart(self) -> LocalServer:
        """Stop the server and start it again on the same port."""
        self.stop()
        return self.start()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        """Return the server's output so far."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 15) -> str:
        return " | ".join(self.log_text().strip().splitlines()[-n:])

    def __enter__(self) -> LocalServer:
        # ``with server.start():`` enters a running server: it is not started a second time.
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
