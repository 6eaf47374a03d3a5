"""The ``openai`` engine: one cycle's generation streamed from an OpenAI-compatible server.

Any server that speaks the OpenAI streaming API answers it: vLLM, llama.cpp's ``llama-server``,
llama-cpp-python's ``llama_cpp.server``, TensorRT-LLM's ``trtllm-serve``, Ollama. The HTTP and the
Server-Sent Events are the ``openai`` client's (its async client on httpx); nothing here parses
HTTP or SSE by hand.

One generation::

    generate() ─► coroutine on the engine's event-loop thread:
                    POST /v1/completions (or /chat/completions), stream=True
                    each chunk: stamped with the injected clock as it arrives (TTFT, ITL)
                    output complete (the request's contract)? ─► stop: the stream is closed
                    the stream's end (finish, complete, fault) stamped when it happens
               ◄─ waits until the coroutine ends, the request's deadline passes or abort is set;
                  then the task is cancelled, which closes the connection, so the server aborts
                  the request (vLLM and llama.cpp's servers drop a request whose client left)

The caller is never held by a request it gave up: the next generation is a new request on its own
connection, whatever the last one still does. Faults end the trace with ``stop_reason="error"``
and a ``fault`` the planner records as the fallback reason (:data:`SERVER_FAULTS`).

How it ended, as the in-process engines say it: ``complete`` when the text became a complete
output of the request's contract (``request.complete``; checked piece by piece,
:class:`~robot_latency.engines.completion.CompletionWatch`) and the stream was closed there;
``done`` when the server finished it (``finish_reason: "stop"``); ``max_tokens`` at its length
limit. ``finished_ns`` is when that happened (the chunk that completed or finished it, or the
fault), not when the caller collected the trace; a request given up or cancelled ends when it
was.

Timing at the robot: ``token_ns`` holds one stamp per streamed chunk that carried text, taken when
the chunk arrived. A server may put several tokens in one chunk (vLLM under load does); such a
chunk is one gap, not several invented ones. The token count comes from the server's ``usage``
(``stream_options.include_usage``) when it sends one, else from the chunks (llama-cpp-python's
server sends one token per chunk and no streamed usage); ``server["tokens_counted_by"]`` says which.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.base import (
    FINISHED,
    AbortSignal,
    ClosesOnExit,
    EngineError,
    GenerationRequest,
    GenerationTrace,
    StopReason,
    register_engine,
)
from robot_latency.engines.completion import CompletionWatch
from robot_latency.engines.openai_config import (  # noqa: F401  (re-exported)
    SERVER_APIS,
    SERVER_FAULTS,
    SERVER_KINDS,
    OpenAIServerConfig,
    ServerCheckError,
    check_server,
    fault_of,
    read_chunk,
)

log = logging.getLogger(__name__)

#: How often the waiting caller looks at the abort flag (s).
_ABORT_POLL_S = 0.002


@dataclass
class _Stream:
    """What one request's coroutine saw; written on the event-loop thread, read under lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    closed: bool = False           # the caller has taken its snapshot: write nothing more
    token_ns: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    chunks: int = 0
    response_ns: int | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    complete: bool = False          # stopped early: the text is a complete output
    fault: str | None = None
    error: str | None = None
    ended_ns: int | None = None     # when the stream ended by itself (finish, complete, fault)

    def own_end(self) -> StopReason:
        """Why the stream ended by itself (call once ``done`` is set, under ``lock``)."""
        if self.fault is not None:
            return StopReason.ERROR
        if self.complete:
            return StopReason.COMPLETE
        if self.finish_reason == "stop":
            return StopReason.DONE
        if self.finish_reason == "length":
            return StopReason.MAX_TOKENS
        return StopReason.ERROR  # [DONE] without a finish_reason (PendingGeneration.finish)


class OpenAIServerEngine(ClosesOnExit):
    """Stream one generation per cycle from an OpenAI-compatible server (module docstring).

    Args:
        config: the engine's settings.
        clock: the injected clock.
        contract: the planner profile's output contract, when the caller has the profile loaded
            (the hybrid runner); None: loaded here from ``config.profile`` (the engine in a
            worker process).
    """

    name = "openai"

    def __init__(self, config: OpenAIServerConfig, *, clock: Clock = DEFAULT_CLOCK,
                 contract: Any = None) -> None:
        import httpx
        import openai

        from robot_latency.profiles.profile import load_planning

        self.config = config
        self.clock = clock
        self.contract = contract if contract is not None else \
            load_planning(config.profile).contract
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-engine",
                                        daemon=True)
        self._thread.start()
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url, api_key=os.environ.get(config.api_key_env) or "none",
            max_retries=0,
            # No read timeout of the client's own: the request ends at its deadline, decided
            # here; the connect timeout bounds a SYN that nobody answers.
            timeout=httpx.Timeout(None, connect=config.connect_timeout_s))
        # The client imports its API resources on first use (about 1 s here on a busy 2-core
        # machine): import them now, so neither the start-up check's timeout nor the first
        # cycle's deadline pays for it.
        _ = (self._client.models, self._client.completions, self._client.chat.completions)
        self.model = config.server_model
        self.kind = config.server_kind
        self.check_error: str | None = None
        self.server_models: list[str] = []
        self.requests = 0
        self.closed = False
        try:
            self.check()
        except ServerCheckError as err:
            # The node starts anyway (a robot's server may come up later); cycles fall back.
            self.check_error = str(err)
            log.warning("%s", err)

    # --- the event loop -------------------------------------------------------------------------
    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def check(self) -> list[str]:
        """Ask the server for its models (``GET /v1/models``); learn the model and server kind.

        Returns:
            the model names the server lists.

        Raises:
            ServerCheckError: no answer within ``check_timeout_s`` (the message names the URL).
        """
        fut = self._submit(self._list_models())
        try:
            models = fut.result(timeout=self.config.check_timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ServerCheckError(f"server {self.config.base_url} did not answer within "
                                   f"{self.config.check_timeout_s:g} s") from None
        except Exception as err:
            _, message = fault_of(err)
            raise ServerCheckError(f"server {self.config.base_url} is unreachable: "
                                   f"{message}") from err
        self._learn(models)
        self.check_error = None
        return self.server_models

    def _learn(self, models: list[dict[str, Any]]) -> None:
        """Take the model name (when none was given) and the server kind (``auto``) from the
        server's model list."""
        self.server_models = [str(m.get("id")) for m in models]
        if not self.model and self.server_models:
            self.model = self.server_models[0]
        if self.kind == "auto":
            owners = {str(m.get("owned_by", "")) for m in models}
            self.kind = ("llamacpp" if owners & {"me", "llamacpp"} else
                         "vllm" if "vllm" in owners else "generic")

    async def _list_models(self) -> list[dict[str, Any]]:
        page = await self._client.models.list()
        return [m.model_dump() for m in page.data]

    # --- the request ----------------------------------------------------------------------------
    def _contract_fields(self, api: str) -> dict[str, Any]:
        """Return the request fields that carry the output contract to this kind of server."""
        if not self.config.grammar:
            return {}
        contract = self.contract
        grammar = getattr(contract, "grammar", None)
        schema = getattr(contract, "schema", None)
        kind = self.kind if self.kind != "auto" else "generic"
        if kind == "llamacpp":
            return {"grammar": grammar} if grammar else {}
        out: dict[str, Any] = {}
        if schema is not None and api == "chat":
            out["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "plan", "schema": schema, "strict": True}}
        elif schema is not None and kind == "vllm":
            out["structured_outputs"] = {"json": schema}
        elif grammar and kind == "vllm":
            out["structured_outputs"] = {"grammar": grammar}
        return out

    def _body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        api = self.config.server_api
        extra = {**self._contract_fields(api), **(self.config.request_extra or {})}
        body: dict[str, Any] = {
            "model": self.model or "default", "max_tokens": request.max_tokens,
            "temperature": request.temperature, "seed": request.seed, "stream": True,
            "stream_options": {"include_usage": True}}
        if request.stop:
            body["stop"] = list(request.stop)
        if api == "chat":
            if not request.messages:
                raise EngineError("openai: server_api=chat needs the profile's messages, and "
                                  "this request carries none")
            body["messages"] = [{"role": r, "content": c} for r, c in request.messages]
            if "response_format" in extra:
                body["response_format"] = extra.pop("response_format")
        else:
            body["prompt"] = request.full_prompt
        return api, {**body, "extra_body": extra} if extra else body

    async def _stream(self, request: GenerationRequest, state: _Stream) -> None:
        clock = self.clock
        watch = CompletionWatch(request.complete)
        try:
            if self.kind == "auto" or (not self.model and not self.server_models):
                # Not learnt at start-up (the server was down then): ask once it answers.
                self._learn(await self._list_models())
            api, body = self._body(request)
            create = (self._client.chat.completions.create if api == "chat"
                      else self._client.completions.create)
            stream = await create(**body)
            state.response_ns = clock()
            async with stream:
                async for chunk in stream:
                    now = clock()
                    text, finish, usage = read_chunk(chunk, api)
                    with state.lock:
                        if state.closed:
                            return
                        state.chunks += 1
                        if usage is not None:
                            state.usage = usage
                        if text:
                            state.token_ns.append(now)
                            state.pieces.append(text)
                        if finish:
                            state.finish_reason = finish
                            state.ended_ns = now
                        if text and watch.feed(text):
                            state.complete, state.ended_ns = True, now
                    if state.complete:
                        return  # leaving `async with` closes the stream: the server stops
        except asyncio.CancelledError:
            raise
        except Exception as err:  # every fault ends in the trace, never in the caller
            fault, message = fault_of(err)
            with state.lock:
                state.fault, state.error, state.ended_ns = fault, message, clock()
            log.debug("openai request failed: %s", message)
        finally:
            with state.lock:
                if state.ended_ns is None:
                    state.ended_ns = clock()
            state.done.set()

    # --- the protocol ---------------------------------------------------------------------------
    def generate(self, request: GenerationRequest, *,
                 abort: AbortSignal | None = None) -> GenerationTrace:
        """Stream one generation; return by ``request.deadline_ns`` whatever the server does."""
        pending = self.start(request)
        return pending.wait(abort=abort)

    def start(self, request: GenerationRequest) -> PendingGeneration:
        """Send ``request`` and return at once; :meth:`PendingGeneration.wait` collects it."""
        self.requests += 1
        state = _Stream()
        started = self.clock()
        fut = self._submit(self._stream(request, state))
        return PendingGeneration(self, request, state, fut, started)

    def info(self) -> dict[str, Any]:
        """Return the settings, the server's answer at start-up and what was learnt from it."""
        return {"engine": self.name, **asdict(self.config), "base_url": self.config.base_url,
                "model": self.model, "server_kind_in_effect": self.kind,
                "server_models": self.server_models, "check_error": self.check_error,
                "contract": getattr(self.contract, "kind", None)}

    def close(self) -> None:
        """Close the client and stop the event-loop thread (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._submit(self._client.close()).result(timeout=2.0)
        except Exception as err:  # closing must not raise
            log.debug("openai client close: %r", err)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self._loop.close()


class PendingGeneration:
    """One request in flight: wait for it until its deadline, or cancel it."""

    def __init__(self, engine: OpenAIServerEngine, request: GenerationRequest, state: _Stream,
                 future: concurrent.futures.Future[Any], started_ns: int) -> None:
        self.engine, self.request, self.state, self.future = engine, request, state, future
        self.started_ns = started_ns
        self._trace: GenerationTrace | None = None

    @property
    def done(self) -> bool:
        """The request ended on its own (answer, fault)."""
        return self.state.done.is_set()

    def finished_text(self) -> str | None:
        """The text, once the stream ended by itself with its output finished (the server's
        ``stop`` or a complete output: :func:`~robot_latency.engines.base.finished`); else
        None (still open, cut short, failed)."""
        state = self.state
        with state.lock:
            if not state.done.is_set() or state.own_end() not in FINISHED:
                return None
            return "".join(state.pieces)

    def wait(self, *, abort: AbortSignal | None = None,
             until_ns: int | None = None) -> GenerationTrace:
        """Wait until the request ends, ``abort`` is set, or ``until_ns`` (default: the
        request's deadline) passes; then close it and return its trace."""
        clock = self.engine.clock
        limit = self.request.deadline_ns if until_ns is None else until_ns
        stop: StopReason | None = None
        while not self.state.done.is_set():
            if abort is not None and abort.is_set():
                stop = StopReason.ABORTED
                break
            left_s = None if limit is None else (limit - clock()) / 1e9
            if left_s is not None and left_s <= 0:
                stop = StopReason.DEADLINE
                break
            step = _ABORT_POLL_S if abort is not None else left_s
            if step is not None and left_s is not None:
                step = min(step, left_s)
            self.state.done.wait(step)
        return self.finish(stop)

    def cancel(self) -> GenerationTrace:
        """Close the request now (the server aborts it) and return what it produced."""
        return self.finish(StopReason.ABORTED)

    def finish(self, stop: StopReason | None) -> GenerationTrace:
        """Take the trace; with ``stop`` given and the stream still open, cancel the request
        first (closes its stream). A stream that ended by itself keeps its own end and time."""
        if self._trace is not None:
            return self._trace
        state, engine = self.state, self.engine
        # Whether the stream ended by itself is decided before it is cancelled: the cancel's
        # own end (the task's ``finally`` on the event-loop thread, which can run before this
        # thread takes the lock on a loaded host) is not the stream's end, and a stall given
        # up at its deadline must not read as "ended without a finish_reason".
        with state.lock:
            state.closed = True
            ended = state.done.is_set()
        if stop is not None and not ended:
            self.future.cancel()  # the task's CancelledError closes the HTTP stream
        with state.lock:
            # Given up or cancelled while the stream was open: it ends now, as the caller
            # stopped it; otherwise when the server's last chunk (or the fault) came.
            finished_ns = state.ended_ns if ended and state.ended_ns is not None \
                else engine.clock()
            trace = GenerationTrace(started_ns=self.started_ns, finished_ns=finished_ns)
            trace.token_ns = list(state.token_ns)
            trace.text = "".join(state.pieces)
            usage = state.usage or {}
            by_usage = usage.get("completion_tokens") is not None
            trace.stop_reason = state.own_end() if ended else (stop or StopReason.ABORTED)
            fault = state.fault if ended else None
            if ended and trace.stop_reason is StopReason.ERROR and fault is None:
                # [DONE] without a finish_reason: an interrupted answer can look finished
                # (llama-cpp-python's server ends a stream this way when another request
                # arrives, unless started with --interrupt_requests false).
                fault = "invalid_output"
                trace.error = (f"stream ended without a finish_reason "
                               f"(finish_reason={state.finish_reason!r}); not a complete plan")
            elif trace.stop_reason is StopReason.ERROR:
                trace.error = state.error
            server: dict[str, Any] = {
                "url": engine.config.base_url, "api": engine.config.server_api,
                "model": engine.model, "kind": engine.kind, "chunks": state.chunks,
                "text_chunks": len(state.token_ns),
                "completion_tokens": usage.get("completion_tokens") if by_usage
                else len(state.token_ns),
                "tokens_counted_by": "usage" if by_usage else "chunks",
                "prompt_tokens": usage.get("prompt_tokens"),
                "finish_reason": state.finish_reason,
                "response_ms": None if state.response_ns is None
                else (state.response_ns - self.started_ns) / 1e6,
                "closed_early": not ended or state.complete,
                "fault": fault}
            if by_usage:
                trace.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        trace.server = server
        trace.fault = fault if trace.stop_reason is StopReason.ERROR else None
        self._trace = trace
        return trace


@register_engine("openai")
def make_openai_engine(*, clock: Clock = DEFAULT_CLOCK, contract: Any = None,
                       **options: Any) -> OpenAIServerEngine:
    """Create an :class:`OpenAIServerEngine` from keyword options (fields of
    :class:`OpenAIServerConfig`); ``contract``: the loaded profile's, if the caller has it."""
    try:
        config = OpenAIServerConfig(**options)
    except TypeError as err:
        raise EngineError(f"openai: {err}") from err
    return OpenAIServerEngine(config, clock=clock, contract=contract)
