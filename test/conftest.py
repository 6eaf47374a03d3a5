"""Fixtures shared by the whole suite: small llama GGUF files written in the test, the servers,
and the check that nothing the suite started is still running at its end.

Two writers, handed out as session fixtures (the test tree is not a package, and pytest's
importlib mode puts no test folder on ``sys.path``, so tests cannot import a helper module):

* :func:`random_llama_gguf`: a random-weight llama with the planner's real vocabulary, written
  with the project's own exporter (:func:`robot_latency.models.export.export_gguf`): a file that
  llama.cpp, the ONNX exporter and the quantization ladder can load and run.
* :func:`tiny_llama_gguf`: a 2-layer llama written key by key with ``gguf.GGUFWriter``
  (placeholder tokens, keys or tensors left out on request, quantized tensors): the reader's
  inputs, broken ones included, for tests of what is read from a file rather than run.

``gguf`` and the exporter are imported when a file is written, so test modules that skip
without them still collect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    import gguf

TensorEdit = Callable[[dict[str, np.ndarray]], None]


def write_random_llama_gguf(
    path: Path,
    *,
    dim: int = 128,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn_dim: int = 256,
    context_length: int = 1024,
    seed: int = 0,
    matrix_std: float | None = 0.05,
    norm_jitter: float | None = 0.1,
    edit: TensorEdit | None = None,
) -> Path:
    """Write a random-weight llama GGUF (F32) with the planner vocabulary; return ``path``.

    Tensors are drawn in :func:`~robot_latency.models.export.gguf_tensor_names` order from one
    ``numpy.random.default_rng(seed)`` stream, so a seed always gives the same file.

    Args:
        path: the file to write.
        dim, n_layers, n_heads, n_kv_heads, ffn_dim, context_length: the model's shape (the
            defaults: 128 wide, 2 layers, 4 query / 2 KV heads (GQA), FFN 256, context 1024).
        seed: the random stream's seed.
        matrix_std: standard deviation of every matrix; None: fan-in scaling (each matrix
            ``1/sqrt(row length)``, the token embedding 0.5), which keeps activations O(1) at
            any width.
        norm_jitter: norm gains are ``1 + norm_jitter * N(0, 1)`` (away from 1, so a mistake in
            their use shows); None: exactly 1, and no draws for them.
        edit: called with the tensors before they are written, to change them in place.
    """
    from robot_latency.models.export import GGUFShape, export_gguf, gguf_tensor_names
    from robot_latency.models.tokenizer import build_vocab

    vocab = build_vocab()
    shape = GGUFShape(vocab_size=vocab.size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                      n_kv_heads=n_kv_heads, ffn_dim=ffn_dim, context_length=context_length)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, tshape in gguf_tensor_names(shape).items():
        if len(tshape) == 1:
            tensors[name] = (np.ones(tshape, np.float32) if norm_jitter is None else
                             (1.0 + norm_jitter * rng.standard_normal(tshape)).astype(np.float32))
            continue
        if matrix_std is not None:
            std = matrix_std
        else:
            std = 0.5 if name == "token_embd.weight" else tshape[1] ** -0.5
        tensors[name] = (rng.standard_normal(tshape) * std).astype(np.float32)
    if edit is not None:
        edit(tensors)
    return export_gguf(path, shape, tensors, vocab=vocab)


#: The shape :func:`write_tiny_llama_gguf` writes: 2 layers, hidden 64, 4 heads / 2 KV heads
#: (head_dim 16), FFN 128, vocabulary 100.
TINY_LAYERS, TINY_HIDDEN, TINY_HEADS, TINY_KV_HEADS, TINY_FFN, TINY_VOCAB = 2, 64, 4, 2, 128, 100


def write_tiny_llama_gguf(
    path: Path,
    *,
    arch: str = "llama",
    tied: bool = False,
    matrix_type: gguf.GGMLQuantizationType | None = None,
    embd_type: gguf.GGMLQuantizationType | None = None,
    file_type: int | None = None,
    token_list: bool = True,
    block_count: int | None = TINY_LAYERS,
    key_length: int | None = None,
    tensor_layers: int = TINY_LAYERS,
    with_tensors: bool = True,
) -> Path:
    """Write a tiny llama GGUF key by key (random N(0, 1) weights, seed 0); return ``path``.

    numpy shapes are (rows, row_length), ggml's (ne1, ne0).

    Args:
        path: the file to write.
        arch: ``general.architecture`` (and the prefix of the hyper-parameter keys).
        tied: leave out ``output.weight`` (the output reuses the token embedding).
        matrix_type: the type of the layer and output matrices (default F32; a quantized type
            is written with ``gguf.quants.quantize``).
        embd_type: the token embedding's type (default F32).
        file_type: ``general.file_type``; None: the key is left out.
        token_list: write a 100-token ``tokenizer.ggml.tokens`` list.
        block_count: ``<arch>.block_count``; None: the key is left out.
        key_length: ``<arch>.attention.key_length`` and ``value_length``; None: left out.
        tensor_layers: how many blocks of tensors to write (may disagree with block_count).
        with_tensors: False: a file with keys only.
    """
    import gguf
    from gguf.quants import quantize

    q = gguf.GGMLQuantizationType
    matrix_type = q.F32 if matrix_type is None else matrix_type
    embd_type = q.F32 if embd_type is None else embd_type
    hidden, ffn, vocab = TINY_HIDDEN, TINY_FFN, TINY_VOCAB
    kv_dim = TINY_KV_HEADS * (hidden // TINY_HEADS)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    if block_count is not None:
        w.add_block_count(block_count)
    w.add_embedding_length(hidden)
    w.add_head_count(TINY_HEADS)
    w.add_head_count_kv(TINY_KV_HEADS)
    w.add_feed_forward_length(ffn)
    w.add_context_length(256)
    if key_length is not None:
        w.add_key_length(key_length)
        w.add_value_length(key_length)
    if file_type is not None:
        w.add_file_type(file_type)
    if token_list:
        w.add_token_list([f"tok{i}" for i in range(vocab)])

    def add(name: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> None:
        data = rng.standard_normal(shape).astype(np.float32)
        if qtype == q.F32:
            w.add_tensor(name, data)
        elif qtype == q.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    if with_tensors:
        add("token_embd.weight", (vocab, hidden), embd_type)
        for i in range(tensor_layers):
            add(f"blk.{i}.attn_norm.weight", (hidden,), q.F32)
            add(f"blk.{i}.attn_q.weight", (hidden, hidden), matrix_type)
            add(f"blk.{i}.attn_k.weight", (kv_dim, hidden), matrix_type)
            add(f"blk.{i}.attn_v.weight", (kv_dim, hidden), matrix_type)
            add(f"blk.{i}.attn_output.weight", (hidden, hidden), matrix_type)
            add(f"blk.{i}.ffn_norm.weight", (hidden,), q.F32)
            add(f"blk.{i}.ffn_gate.weight", (ffn, hidden), matrix_type)
            add(f"blk.{i}.ffn_up.weight", (ffn, hidden), matrix_type)
            add(f"blk.{i}.ffn_down.weight", (hidden, ffn), matrix_type)
        add("output_norm.weight", (hidden,), q.F32)
        if not tied:
            add("output.weight", (vocab, hidden), matrix_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def random_llama_gguf() -> Callable[..., Path]:
    """Return :func:`write_random_llama_gguf`: ``random_llama_gguf(path, dim=..., seed=...)``."""
    return write_random_llama_gguf


@pytest.fixture(scope="session")
def tiny_llama_gguf() -> Callable[..., Path]:
    """Return :func:`write_tiny_llama_gguf`: ``tiny_llama_gguf(path, tied=True, ...)``."""
    return write_tiny_llama_gguf


# --- Nothing outlives the suite ----------------------------------------------------------------
#: Helpers of Python's own that live as long as the pytest process, by a part of their command
#: line: multiprocessing's resource tracker and fork server, and pytest-xdist's workers.
OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver",
               "exec(eval(sys.stdin.readline()))")


def leftover_processes(root: Any, *, grace_s: float = 10.0) -> list[Any]:
    """Descendants of ``root`` (a ``psutil.Process``) still alive after ``grace_s``, helpers out.

    A zombie has ended (it only waits to be reaped), so it does not count. The grace lets a
    process that was just killed finish dying; it is a bound, not a timing.
    """
    import psutil

    def alive() -> list[Any]:
        out = []
        for proc in root.children(recursive=True):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmdline = " ".join(proc.cmdline())
            except psutil.Error:  # ended meanwhile
                continue
            if not any(helper in cmdline for helper in OWN_HELPERS):
                out.append(proc)
        return out

    left = alive()
    if left:
        psutil.wait_procs(left, timeout=grace_s)
        left = alive()
    return left


def describe(procs: list[Any]) -> str:
    import psutil

    lines = []
    for proc in procs:
        try:
            lines.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:300]}")
        except psutil.Error:
            lines.append(f"pid {proc.pid}: (ended while being named)")
    return "\n".join(lines)


@pytest.fixture(scope="session")
def leftovers() -> tuple[Callable[..., list[Any]], Callable[[list[Any]], str]]:
    """(:func:`leftover_processes`, :func:`describe`), for the test of the check itself."""
    return leftover_processes, describe


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running() -> Iterator[None]:
    """Fail the suite when a process it started (any descendant of pytest) is still running.

    pytest becomes a child subreaper first, so a process orphaned by its owner's death (a test's
    owner process killed) is adopted by pytest instead of init, and is still found here.
    """
    import psutil

    from robot_latency.lifetime import set_subreaper

    set_subreaper()
    me = psutil.Process()
    yield
    left = leftover_processes(me)
    if left:
        names = describe(left)
        for proc in left:  # the suite fails, but leaves nothing behind either
            try:
                proc.kill()
            except psutil.Error:
                pass
        pytest.fail(f"{len(left)} process(es) the suite started outlived it:\n{names}",
                    pytrace=False)


#: Typed forms an operator may send, and the plain forms the bundled planner was trained on.
TYPED_AND_PLAIN = [
    ("STOP", "stop"),
    ("Stop!", "stop"),
    ("  stop  ", "stop"),
    ("Wait here.", "wait here"),
    ("Go to the charging dock slowly.", "go to the charging dock slowly"),
    ("Pick up the RED cup, and place it on the tray!",
     "pick up the red cup and place it on the tray"),
    ("Bring me the   blue bottle,   please", "bring me the blue bottle please"),
]


@pytest.fixture(scope="session")
def typed_and_plain() -> list[tuple[str, str]]:
    """(typed, plain) command pairs: capitals, punctuation and extra spaces vs training form."""
    return list(TYPED_AND_PLAIN)



# --- OpenAI-compatible servers: a real one, and one that misbehaves on purpose ----------------
@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """llama-cpp-python's own server (``python -m llama_cpp.server``) on 127.0.0.1 at a free
    port, serving the bundled planner; killed at teardown, whatever the tests did."""
    from robot_latency.engines.llama_server import LocalServer
    from robot_latency.models.bundled import bundled_model_path

    server = LocalServer(bundled_model_path(), n_threads=1,
                         log_path=tmp_path_factory.mktemp("llama-server") / "server.log")
    try:
        yield server.start()
    finally:
        server.stop()


class MisbehavingServer:
    """An OpenAI-compatible server written to misbehave: the request's ``model`` picks how.

    ``plan`` streams a valid action plan; ``endless_plan`` a complete one (``<end>`` included),
    then more text and no finish (bounded); ``slow`` streams ``<pick>`` forever (bounded by
    :attr:`MAX_STREAM_S`), ``endless`` the same for longer than any test waits (bounded by
    :attr:`ENDLESS_STREAM_S`: only a closed stream ends it in a test);
    ``stall`` sends one chunk, then nothing; ``malformed`` sends data that is not JSON;
    ``error_event`` an error object inside the stream; ``no_finish`` ends with ``[DONE]`` and no
    finish_reason; ``bad_plan`` finishes text that breaks the contract; ``http500`` / ``http404``
    answer with that status. ``events`` records, in order, ("request", mode), then for a stream
    ("disconnected", mode) when the client closed it before its end (its generator is cancelled:
    nothing more is generated for it) or ("finished", mode) when it ran to its end.
    """

    MAX_STREAM_S = 30.0  # every stream ends by itself after this (a hang guard) ...
    ENDLESS_STREAM_S = 900.0  # ... but "endless", which outlasts any test's deadline

    def __init__(self) -> None:
        import threading

        import uvicorn

        from robot_latency.engines.llama_server import free_port

        self.events: list[tuple[str, str]] = []
        self.port = free_port()
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="misbehaving-server",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _app(self) -> Any:
        import asyncio
        import json

        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        def chunk(text: str, finish: str | None = None) -> str:
            return "data: " + json.dumps({
                "id": "cmpl-test", "object": "text_completion", "created": 0, "model": "fake",
                "choices": [{"index": 0, "text": text, "finish_reason": finish,
                             "logprobs": None}]}) + "\n\n"

        async def models(_request: Any) -> Any:
            return JSONResponse({"object": "list", "data": [
                {"id": "plan", "object": "model", "owned_by": "test"}]})

        async def completions(request: Any) -> Any:
            body = await request.json()
            mode = str(body.get("model"))
            self.events.append(("request", mode))
            if mode in ("http500", "http404"):
                return JSONResponse({"error": {"message": f"{mode} on purpose"}},
                                    status_code=int(mode[4:]))

            async def gen() -> Any:
                loop = asyncio.get_running_loop()
                end = loop.time() + (self.ENDLESS_STREAM_S if mode == "endless"
                                     else self.MAX_STREAM_S)
                try:
                    if mode == "plan":
                        for piece in ("<pick>", "<col:red>", "<obj:cup>"):
                            yield chunk(piece)
                        yield chunk("", "stop")
                    elif mode == "endless_plan":
                        for piece in ("<pick>", "<col:red>", "<obj:cup>", "<end>"):
                            yield chunk(piece)
                        while loop.time() < end:
                            yield chunk("<pick>")
                            await asyncio.sleep(0.02)
                    elif mode in ("slow", "endless"):
                        while loop.time() < end:
                            yield chunk("<pick>")
                            await asyncio.sleep(0.02)
                    elif mode == "stall":
                        yield chunk("<pick>")
                        while loop.time() < end:
                            await asyncio.sleep(0.05)
                    elif mode == "malformed":
                        yield chunk("<pick>")
                        yield "data: {this is not json\n\n"
                    elif mode == "error_event":
                        yield chunk("<pick>")
                        yield 'data: {"error": {"message": "overloaded on purpose"}}\n\n'
                    elif mode == "no_finish":
                        for piece in ("<pick>", "<col:red>", "<obj:cup>"):
                            yield chunk(piece)
                    elif mode == "bad_plan":
                        yield chunk("hello robot")
                        yield chunk("", "stop")
                    yield "data: [DONE]\n\n"
                    self.events.append(("finished", mode))
                except asyncio.CancelledError:
                    self.events.append(("disconnected", mode))
                    raise
            return StreamingResponse(gen(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/models", models),
                                 Route("/v1/completions", completions, methods=["POST"])])

    def start(self) -> MisbehavingServer:
        import time

        self._thread.start()
        end = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > end or not self._thread.is_alive():
                raise RuntimeError("misbehaving server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def wait_for(self, event: tuple[str, str], timeout_s: float = 30.0) -> bool:
        """Wait until ``event`` was recorded (a hang guard, not a timing)."""
        import time

        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if event in self.events:
                return True
            time.sleep(0.01)
        return event in self.events


@pytest.fixture(scope="session")
def misbehaving_server() -> Iterator[MisbehavingServer]:
    """A :class:`MisbehavingServer` on 127.0.0.1, stopped at teardown."""
    server = MisbehavingServer()
    try:
        yield server.start()
    finally:
        server.stop()
