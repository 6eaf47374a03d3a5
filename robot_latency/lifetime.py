"""Nothing outlives its owner: a process the project starts dies with the process that started it.

A child asks the kernel to follow its parent with ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: when the
parent dies, however it dies (SIGKILL included, where no ``finally`` or ``atexit`` runs), the
kernel kills the child. Two details make that hold:

* The signal fires when the parent *thread* that forked the child exits, not the parent process.
  A server started from a short-lived thread (a ROS callback, a worker pool) would die with that
  thread. So every start happens on a thread that lives as long as the process: the main thread,
  or else one long-lived daemon thread here (daemon threads are never ended before the process).
* The parent may die between the fork and the ``prctl``; the child then belongs to init already
  and would never get the signal. So it checks ``getppid()`` after asking, and dies at once when
  its parent is no longer the one that started it.

:func:`popen` starts a command (``preexec_fn`` asks, in the child, before ``exec``; the setting
survives ``exec``). :func:`process` makes a ``multiprocessing`` process whose target asks first
thing, :func:`start` starts it (:func:`start_process`: both). :func:`follow_parent` is the
``preexec_fn`` for a blocking ``subprocess.run``.
Linux only; elsewhere these start the process as usual.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

#: prctl(2) options (linux/prctl.h).
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

T = TypeVar("T")


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.prctl
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


# Resolved once in the parent: the child between fork and exec calls it and nothing more.
_PRCTL = _load_prctl()


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """In a child: be sent ``sig`` when the parent ends; die now if it has ended already.

    Args:
        parent_pid: the pid of the process that started this one (read before the start).
        sig: the signal the kernel sends when the parent's starting thread exits.
    """
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the prctl: no signal will come
        os.kill(os.getpid(), sig)


def follow_parent(then: Callable[[], Any] | None = None) -> Callable[[], None]:
    """Return a ``preexec_fn`` that makes the child die with this process, then calls ``then``.

    For :func:`popen`, and for a blocking ``subprocess.run(..., preexec_fn=follow_parent())``
    (which waits on the calling thread, so that thread outlives the child).
    """
    parent_pid = os.getpid()

    def preexec() -> None:
        die_with_parent(parent_pid)
        if then is not None:
            then()
    return preexec


def set_subreaper(on: bool = True) -> bool:
    """Make this process adopt its orphaned descendants (they stay under it, for a check);
    ``on=False`` gives them back to init again."""
    if _PRCTL is None:
        return False
    return _PRCTL(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0


class _OwnerThread:
    """One daemon thread that starts processes for threads that may end before them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] | None = None
        self._pid = 0

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            if self._queue is None or self._pid != os.getpid():  # none yet, or a forked copy
                self._queue = queue.SimpleQueue()
                self._pid = os.getpid()
                threading.Thread(target=self._serve, args=(self._queue,), daemon=True,
                                 name="robot-latency-process-owner").start()
            jobs = self._queue
        done: Future[T] = Future()
        jobs.put((fn, done))
        return done.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
        while True:  # never returns: its exit would signal every child it started
            fn, done = jobs.get()
            try:
                done.set_result(fn())
            except BaseException as err:  # handed to the caller, raised there
                done.set_exception(err)


_OWNER = _OwnerThread()


def popen(args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)`` whose child dies when this process dies.

    A ``preexec_fn`` in ``kwargs`` still runs, after the child has asked to follow.
    """
    preexec = follow_parent(kwargs.pop("preexec_fn", None))
    return _OWNER.call(lambda: subprocess.Popen(args, preexec_fn=preexec, **kwargs))


class _Followed:
    """A picklable target that asks to follow its parent, then runs the real target."""

    def __init__(self, target: Callable[..., Any], parent_pid: int) -> None:
        self.target = target
        self.parent_pid = parent_pid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        die_with_parent(self.parent_pid)
        return self.target(*args, **kwargs)


def process(ctx: Any, target: Callable[..., Any], **kwargs: Any) -> Any:
    """Return ``ctx.Process(target=target, **kwargs)``, not started, that dies with this process.

    Args:
        ctx: a multiprocessing context (``multiprocessing.get_context("spawn")``).
        target: the process's function (picklable, as ``spawn`` needs).
        kwargs: ``Process``'s other arguments (args, name, daemon, ...).
    """
    return ctx.Process(target=_Followed(target, os.getpid()), **kwargs)


def start(proc: Any) -> Any:
    """Start a process made by :func:`process`, from a thread that lives as long as this one."""
    _OWNER.call(proc.start)
    return proc


def start_process(ctx: Any, target: Callable[..., Any], **kwargs: Any) -> Any:
    """:func:`process` then :func:`start`: the started process."""
    return start(process(ctx, target, **kwargs))
