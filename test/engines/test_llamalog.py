"""llama.cpp's own log lines go to the project's logger at debug level, not to the terminal.

Real llama.cpp on the shipped planner: a context larger than the model's trained one makes
llama.cpp warn about ``n_ctx_seq`` on stderr, which is the line these tests follow.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import llama_cpp  # noqa: F401  (a hard requirement: a missing one fails here)
import pytest

from robot_latency.engines import create_engine
from robot_latency.engines.llamalog import LOGGER_NAME, route_llama_log
from robot_latency.planner.worker import ProcessRunner

ROOT = Path(__file__).resolve().parents[2]
LOAD = ("from robot_latency.engines import create_engine; "
        "create_engine('llamacpp', n_ctx=64).close()")


def test_unrouted_llama_cpp_writes_to_stderr() -> None:
    """What the routing fixes: left alone, llama.cpp's warning lands on the terminal."""
    proc = subprocess.run([sys.executable, "-c", LOAD], cwd=ROOT, capture_output=True,
                          text=True, check=True, env={"PYTHONPATH": str(ROOT)})
    assert "n_ctx_seq" in proc.stderr


def test_routed_lines_are_debug_records_not_stderr(caplog: pytest.LogCaptureFixture,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    route_llama_log()
    route_llama_log()  # idempotent
    with caplog.at_level(logging.DEBUG, logger=LOGGER_NAME):
        create_engine("llamacpp", n_ctx=64).close()
    ours = [r for r in caplog.records if r.name == LOGGER_NAME]
    assert any("n_ctx_seq" in r.getMessage() for r in ours)
    assert all(r.levelno == logging.DEBUG for r in ours)
    assert all("\n" not in r.getMessage() and r.getMessage().strip() for r in ours)
    assert "n_ctx_seq" not in capfd.readouterr().err


@pytest.mark.parametrize("level", [logging.WARNING, logging.DEBUG])
def test_engine_worker_routes_too(level: int, caplog: pytest.LogCaptureFixture,
                                  capfd: pytest.CaptureFixture[str]) -> None:
    """The worker process logs at the parent's level: llama.cpp's lines show (prefixed by the
    logger) only when the parent logs debug."""
    caplog.set_level(level)
    with ProcessRunner("llamacpp", {"n_ctx": 64}) as runner:
        assert runner.engine_info["engine"] == "llamacpp"
    err = capfd.readouterr().err
    if level == logging.DEBUG:
        assert f"DEBUG {LOGGER_NAME} (engine worker): llama_context: n_ctx_seq" in err
    else:
        assert "n_ctx_seq" not in err
