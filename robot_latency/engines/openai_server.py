"""The ``openai`` engine: one cycle's generation streamed from an OpenAI-compatible server.

Any server that speaks the OpenAI streaming API answers it: vLLM, llama.cpp's ``llama-server``,
llama-cpp-python's ``llama_cpp.server``, TensorRT-LLM's ``trtllm-serve``, Ollama. The HTTP and the
Server-Sent Events are the ``openai`` client's (its async client on httpx); nothing here parses
HTTP or SSE by hand.

One generation::

    generate() ─► coroutine on the engine's event-loop thread:
                    POST /v1/completions (or /chat/completions), stream=True
                    each chunk: stamped with the injected clock as it arrives (TTFT, ITL)
                    output a complete valid plan? ─► stop: the stream is closed
               ◄─ waits until the coroutine ends, the request's deadline passes or abort is set;
                  then the task is cancelled, which closes the connection, so the server aborts
                  the request (vLLM and llama.cpp's servers drop a request whose client left)

The caller is never held by a request it gave up: the next generation is a new request on its own
connection, whatever the last one still does. Faults end the trace with ``stop_reason="error"``
and a ``fault`` the planner records as the fallback reason (:data:`SERVER_FAULTS`).

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.base import (
    AbortSignal,
    ClosesOnExit,
    EngineError,
    GenerationRequest,
    GenerationTrace,
    StopReason,
    register_engine,
)
from robot_latency.engines.openai_config import (  # noqa: F401  (re-exported)
    SERVER_APIS,
    SERVER_FAULTS,
    SERVER_KINDS,
    OpenAIServerConfig,
    ServerCheckError,
    check_server,
    fault_of,
)

log = logging.getLogger(__name__)

#: How often the waiting caller looks at the abort flag (s).
_ABORT_POLL_S = 0.002


def plan_is_complete(contract: Any, text: str) -> bool:
    """Return True when ``text`` is already a complete plan the contract accepts.

    A JSON plan is complete once it parses and validates; an action plan once its ``<end>``
    token is there and it parses (without ``<end>``, more steps could follow). The engine takes
    this check as a parameter (``complete_check``), so a shared one can replace it.
    """
    from robot_latency.profiles.actions import END_TOKEN, PlanParseError

    if getattr(contract, "kind", None) == "actions" and END_TOKEN not in text:
        return False
    try:
        contract.parse(text)
    except PlanParseError:
        return False
    return True


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
    complete: bool = False          # stopped early: the text is a complete valid plan
    fault: str | None = None
    error: str | None = None


class OpenAIServerEngine(ClosesOnExit):
    """Stream one generation per cycle from an OpenAI-compatible server (module docstring).

    Args:
        config: the engine's settings.
        clock: the injected clock.
        complete_check: ``(contract, text) -> bool``, True once the text is a complete valid
            plan (default :func:`plan_is_complete`).
        contract: the planner profile's output contract, when the caller has the profile loaded
            (the hybrid runner); None: loaded here from ``config.profile`` (the engine in a
            worker process).
    """

    name = "openai"

    def __init__(self, config: OpenAIServerConfig, *, clock: Clock = DEFAULT_CLOCK,
                 complete_check: Callable[[Any, str], bool] = plan_is_complete,
                 contract: Any = None) -> None:
        import httpx
        import openai

        from robot_latency.profiles.profile import load_planning

        self.config = config
        self.clock = clock
        self.complete_check = complete_check
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
                    text, finish, usage = self._read_chunk(chunk, api)
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
                        so_far = "".join(state.pieces) if text and not finish else None
                    if so_far is not None and self.complete_check(self.contract, so_far):
                        state.complete = True
                        return  # leaving `async with` closes the stream: the server stops
        except asyncio.CancelledError:
            raise
        except Exception as err:  # every fault ends in the trace, never in the caller
            state.fault, state.error = fault_of(err)
            log.debug("openai request failed: %s", state.error)
        finally:
            state.done.set()

    @staticmethod
    def _read_chunk(chunk: Any, api: str) -> tuple[str, str | None, dict[str, Any] | None]:
        """Return (text, finish_reason, usage) of one chunk.

        Raises:
            ValueError: a chunk without the fields every OpenAI stream chunk has.
        """
        usage = getattr(chunk, "usage", None)
        usage_d = usage.model_dump() if hasattr(usage, "model_dump") else (
            dict(usage) if isinstance(usage, dict) else None)
        choices = getattr(chunk, "choices", None)
        if choices is None or not isinstance(choices, list):
            raise ValueError(f"chunk without a choices list: {str(chunk)[:120]}")
        if not choices:
            return "", None, usage_d  # the usage-only chunk at the end
        choice = choices[0]
        if api == "chat":
            delta = getattr(choice, "delta", None)
            text = getattr(delta, "content", None) if delta is not None else None
        else:
            text = getattr(choice, "text", None)
        if text is not None and not isinstance(text, str):
            raise ValueError(f"chunk text is {type(text).__name__}, not a string")
        finish = getattr(choice, "finish_reason", None)
        return text or "", finish, usage_d

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
        """Take the trace; with ``stop`` given, cancel the request first (closes its stream)."""
        if self._trace is not None:
            return self._trace
        state, engine = self.state, self.engine
        if stop is not None and not state.done.is_set():
            self.future.cancel()  # the task's CancelledError closes the HTTP stream
        with state.lock:
            state.closed = True
            trace = GenerationTrace(started_ns=self.started_ns)
            trace.token_ns = list(state.token_ns)
            trace.text = "".join(state.pieces)
            usage = state.usage or {}
            by_usage = usage.get("completion_tokens") is not None
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
                "closed_early": stop is not None or state.complete,
                "fault": state.fault}
            if by_usage:
                trace.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            if stop is not None:
                trace.stop_reason = stop
            elif state.fault is not None:
                trace.stop_reason, trace.error = StopReason.ERROR, state.error
            elif state.complete or state.finish_reason == "stop":
                trace.stop_reason = StopReason.DONE
            elif state.finish_reason == "length":
                trace.stop_reason = StopReason.MAX_TOKENS
            else:
                # [DONE] without a finish_reason: an interrupted answer can look finished
                # (llama-cpp-python's server ends a stream this way when another request
                # arrives, unless started with --interrupt_requests false).
                state.fault = "invalid_output"
                trace.stop_reason = StopReason.ERROR
                trace.error = (f"stream ended without a finish_reason "
                               f"(finish_reason={state.finish_reason!r}); not a complete plan")
                server["fault"] = state.fault
        trace.server = server
        trace.fault = state.fault if trace.stop_reason is StopReason.ERROR else None
        trace.finished_ns = engine.clock()
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
