"""Nothing outlives its owner: a server starts once, and what the project starts dies with it.

Real processes throughout: llama-cpp-python's server on the bundled planner, an owner process
killed with SIGKILL (no ``finally``, no ``atexit`` runs in it), threads that end before the
process they started. Every wait is a poll with a generous bound, never a timed gap.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from robot_latency import lifetime
from robot_latency.engines.llama_server import LocalServer
from robot_latency.models.bundled import bundled_model_path

#: The bound on how long a process may take to die after its owner (the issue's 5 s).
GONE_WITHIN_S = 5.0


def servers_on(port: int) -> list[psutil.Process]:
    """The running server processes under this pytest that serve ``port``."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = proc.cmdline()
            if proc.status() != psutil.STATUS_ZOMBIE and "robot_latency.engines.llama_serve" \
                    in cmd and str(port) in cmd:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def gone(pid: int) -> bool:
    """The process has ended (a zombie has: it only waits to be reaped)."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    try:  # adopted by pytest (a subreaper in this suite): reap it
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True


def wait_gone(pid: int, bound_s: float = GONE_WITHIN_S) -> bool:
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


def test_with_start_runs_exactly_one_server(tmp_path: Path) -> None:
    server = LocalServer(bundled_model_path(), n_threads=1, log_path=tmp_path / "server.log")
    with server.start() as entered:
        assert entered is server and server.starts == 1
        assert [p.pid for p in servers_on(server.port)] == [server.proc.pid]
        assert server.start() is server and server.starts == 1  # idempotent
        first = server.proc.pid
    assert not server.running and gone(first)
    assert servers_on(server.port) == []
    # Stopped, it starts again (once) on entry.
    with server:
        assert server.starts == 2 and len(servers_on(server.port)) == 1
    assert servers_on(server.port) == []


OWNER = """
import sys, time
from robot_latency.engines.llama_server import LocalServer
from robot_latency.models.bundled import bundled_model_path
server = LocalServer(bundled_model_path(), n_threads=1, log_path=sys.argv[1]).start()
print(server.proc.pid, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_owners_server_dies_with_it(tmp_path: Path) -> None:
    owner = lifetime.popen([sys.executable, "-c", OWNER, str(tmp_path / "server.log")],
                           stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        line = owner.stdout.readline() if owner.stdout else ""
        assert line.strip().isdigit(), f"owner did not start its server: {line!r} " \
            f"{(tmp_path / 'server.log').read_text(errors='replace')[-2000:]}"
        server_pid = int(line)
        assert not gone(server_pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        assert wait_gone(server_pid), f"server {server_pid} outlived its SIGKILLed owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if server_pid is not None and not gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)
        if owner.stdout:
            owner.stdout.close()


def test_a_process_started_from_an_ending_thread_outlives_the_thread() -> None:
    """The parent-death signal follows the starting *thread*: lifetime starts from one that
    lives as long as the process, so the thread's end is not the owner's end."""
    started: list[subprocess.Popen[bytes]] = []
    plain: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        started.append(lifetime.popen(["sleep", "60"]))
        # Without the owner thread: the same request, made from this short-lived thread.
        plain.append(subprocess.Popen(["sleep", "60"], preexec_fn=lifetime.follow_parent()))

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    try:
        # The plain one died with its thread (which proves the signal is asked for) ...
        assert plain[0].wait(timeout=GONE_WITHIN_S) == -signal.SIGKILL
        # ... by which time the owned one, started first, is still running.
        assert started[0].poll() is None
    finally:
        for proc in started + plain:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


WORKER_OWNER = """
import multiprocessing as mp, sys, time
from robot_latency.lifetime import start_process
from test_lifetime_target import sleep_long
proc = start_process(mp.get_context("spawn"), sleep_long, args=(sys.argv[1],), daemon=True)
print(proc.pid, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_owners_multiprocessing_child_dies_with_it(tmp_path: Path) -> None:
    (tmp_path / "test_lifetime_target.py").write_text(
        "import pathlib, time\n\n"
        "def sleep_long(started):\n"
        "    pathlib.Path(started).write_text('running')\n"
        "    time.sleep(600)\n")
    started = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    owner = lifetime.popen([sys.executable, "-c", WORKER_OWNER, str(started)],
                           stdout=subprocess.PIPE, text=True, env=env)
    child = None
    try:
        line = owner.stdout.readline() if owner.stdout else ""
        assert line.strip().isdigit(), f"owner did not start its child: {line!r}"
        child = int(line)
        end = time.monotonic() + 120  # a hang guard: the child is running its target
        while not started.exists():
            assert not gone(child) and time.monotonic() < end, "the child never ran its target"
            time.sleep(0.05)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        assert wait_gone(child), f"multiprocessing child {child} outlived its SIGKILLed owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)
        if owner.stdout:
            owner.stdout.close()


def test_the_suite_check_names_a_leftover_and_not_pythons_helpers(
        leftovers: tuple[Any, Any]) -> None:
    find, describe = leftovers
    me = psutil.Process()
    # multiprocessing's resource tracker: started by a spawn-context semaphore, lives on.
    mp.get_context("spawn").Event()
    stray = lifetime.popen(["sleep", "60"])
    try:
        left = find(me, grace_s=0.0)
        assert stray.pid in [p.pid for p in left]
        assert f"pid {stray.pid}: sleep 60" in describe(left)
        assert not any("resource_tracker" in " ".join(p.cmdline()) for p in left)
    finally:
        stray.kill()
        stray.wait()
    assert stray.pid not in [p.pid for p in find(me, grace_s=0.0)]


def _direct_starts(path: Path) -> list[int]:
    """Lines in ``path`` that start a process without :mod:`robot_latency.lifetime`:
    ``subprocess.Popen(...)`` or ``<context>.Process(...)``."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("Popen", "Process"):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "psutil":
                continue  # psutil.Process(pid) looks at a process, starts none
            lines.append(node.lineno)
    return lines


def test_every_long_lived_process_is_started_through_lifetime(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    allowed = {"robot_latency/lifetime.py",
               "test/test_lifetime.py"}  # the one helper; this file's counter-example
    found = {str(p.relative_to(root)): _direct_starts(p)
             for d in ("robot_latency", "bench", "test") for p in (root / d).rglob("*.py")}
    found = {k: v for k, v in found.items() if v and k not in allowed}
    assert found == {}, f"start these with robot_latency.lifetime (popen / start_process): {found}"
    probe = tmp_path / "probe.py"  # the check itself finds both kinds
    probe.write_text("import subprocess, multiprocessing as mp\n"
                     "p = subprocess.Popen(['true'])\n"
                     "q = mp.get_context('spawn').Process(target=print)\n")
    assert _direct_starts(probe) == [2, 3]
