"""The engine protocol: one seam for every backend (llama.cpp, ONNX Runtime, simulated).

An engine turns a :class:`GenerationRequest` into a :class:`GenerationTrace`: the tokens, their
text, and a timestamp for every event read from the engine's injected clock. The trace holds raw
timestamps only; every duration (tokenize, prefill, each inter-token gap) is derived from them.
An engine never raises for a generation that went wrong at run time: the trace says so
(``stop_reason="error"`` and ``error``), and the planner falls back.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

from robot_latency.errors import RobotLatencyError


class EngineError(RobotLatencyError):
    """An engine that cannot be created or loaded (bad model file, unknown option)."""


class UnknownEngineError(EngineError, KeyError):
    """An engine name that is not registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StopReason(str, enum.Enum):
    """Why a generation ended."""

    DONE = "done"               # the model ended its output (end token or a stop string)
    COMPLETE = "complete"       # the output is a complete plan: nothing the contract allows
                                # can follow (robot_latency.profiles.contract.output_complete)
    MAX_TOKENS = "max_tokens"   # hit the request's token limit
    DEADLINE = "deadline"       # the engine stopped itself at the request's deadline
    ABORTED = "aborted"         # the caller asked it to stop
    ERROR = "error"             # the engine failed; see ``GenerationTrace.error``


#: The stop reasons of a generation whose output ended by itself: the model's end (end token,
#: stop string, a server's ``finish_reason: "stop"``) or a complete output of the contract.
FINISHED = frozenset({StopReason.DONE, StopReason.COMPLETE})


def finished(trace: GenerationTrace | None) -> bool:
    """Return whether ``trace`` ended with its output finished (:data:`FINISHED`), so its text is
    a plan to judge; cut short (token limit, deadline, abort) or failed: False. Whether the plan
    is valid is the contract's to say."""
    return trace is not None and trace.stop_reason in FINISHED


@runtime_checkable
class AbortSignal(Protocol):
    """Anything with ``is_set()``: threading.Event, the worker's shared AbortFlag."""

    def is_set(self) -> bool: ...


def note_tokens(abort: AbortSignal | None, tokens: int) -> None:
    """Tell a signal that counts them (the engine worker's shared flag) how many tokens are out,
    so the loop's side can tell how far a generation got while it runs (an action's feedback)."""
    note = getattr(abort, "note_tokens", None)
    if note is not None:
        note(tokens)


@dataclass(frozen=True)
class FrameImage:
    """A camera frame a generation sees (an engine with a vision tower; others ignore it).

    Args:
        key: the frame's identity: the same key is the same image (the engine's frame cache).
        data: the image file's bytes (PNG or JPEG), or empty when ``rgb`` is given.
        width: ``rgb``'s width in pixels.
        height: ``rgb``'s height in pixels.
        rgb: packed 8-bit RGB pixels (a raw camera image), or empty.
        scale: the frame is downscaled by this before the tower sees it (1: as taken).
    """

    key: str
    data: bytes = b""
    width: int = 0
    height: int = 0
    rgb: bytes = b""
    scale: float = 1.0


@dataclass(frozen=True)
class GenerationRequest:
    """One generation at batch 1.

    Args:
        prompt: the per-cycle part of the prompt (all of it when ``prefix`` is empty).
        prefix: the fixed part before it, the same every cycle: an engine tokenizes it on its
            own (so its tokens never merge with the command's) and keeps its KV cached.
        max_tokens: most tokens to generate.
        deadline_ns: absolute time, on the engine's clock, after which the engine should stop
            (None: no deadline). The planner enforces the deadline itself as well; this lets
            the engine stop between chunks or tokens instead of burning time nobody will use.
        grammar: GBNF text constraining the output, or None.
        stop: strings that end the output when generated (not included in the text).
        temperature: 0 is greedy.
        seed: sampling seed.
        complete: the output contract's kind (``json``, ``actions``): the generation ends as
            soon as its text is a complete output of it (:data:`StopReason.COMPLETE`), with no
            end token waited for. None: only end tokens, stop strings and limits end it.
        messages: the same prompt as chat turns ``(role, content)`` (system, examples, the
            command), for an engine that sends messages to a server which applies its own chat
            template; empty: not given.
        image: the camera frame, between the prefix and the per-cycle part (an engine with a
            vision tower; None: text only).
    """

    prompt: str
    prefix: str = ""
    max_tokens: int = 32
    deadline_ns: int | None = None
    grammar: str | None = None
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int = 0
    complete: str | None = None
    messages: tuple[tuple[str, str], ...] = ()
    image: FrameImage | None = None

    @property
    def full_prompt(self) -> str:
        """The whole prompt text: prefix, then the per-cycle part."""
        return self.prefix + self.prompt


@dataclass
class GenerationTrace:
    """What one generation did, stamped with the engine's clock (ns).

    ``token_ns[i]`` is when token ``i`` was available to the caller; ``prefill_chunk_ns`` holds
    the end of each prefill chunk (the points where a deadline check or abort can act when layers
    are on a GPU). ``phases_extra_ns`` carries engine-specific phase totals (grammar, abort,
    draft, verify) measured inside the engine. ``server`` is what a server engine learnt about
    the request (URL, API, chunks, token counts, finish reason); ``fault`` is the fallback reason
    of a failed generation where the engine knows a better one than ``engine_error``
    (``server_unreachable``, ``server_error``, ``server_malformed``, ``invalid_output``).
    ``image`` is what the frame took (:mod:`robot_latency.engines.llama_image`): its tokens and
    chunks, whether the KV cache already held it (``reused``) and ``layout_ns``, the part of the
    ``image_encode`` phase spent reading and tokenizing it before the prompt was tokenized.
    """

    started_ns: int
    tokenized_ns: int | None = None
    prefill_chunk_ns: list[int] = field(default_factory=list)
    token_ns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: StopReason = StopReason.DONE
    error: str | None = None
    finished_ns: int | None = None
    prompt_tokens: int = 0
    prefix_cache_tokens: int = 0
    phases_extra_ns: dict[str, int] = field(default_factory=dict)
    draft: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    fault: str | None = None
    image: dict[str, Any] | None = None

    @property
    def tokenize_ns(self) -> int | None:
        """Time spent tokenizing the prompt (a frame's layout is in ``image_encode``)."""
        if self.tokenized_ns is None:
            return None
        return self.tokenized_ns - self.started_ns - self._image("layout_ns")

    @property
    def prefill_ns(self) -> int | None:
        """Time from tokenized to the last prefill chunk, less the frame's encode and image
        prefill (their own phases)."""
        if self.tokenized_ns is None or not self.prefill_chunk_ns:
            return None
        extra = self.phases_extra_ns
        image_ns = (extra.get("image_encode", 0) - self._image("layout_ns")
                    + extra.get("image_prefill", 0))
        return self.prefill_chunk_ns[-1] - self.tokenized_ns - image_ns

    def _image(self, key: str) -> int:
        return int((self.image or {}).get(key, 0))

    @property
    def decode_ns(self) -> int | None:
        """Time from the end of prefill to the last token."""
        if not self.prefill_chunk_ns or not self.token_ns:
            return None
        return self.token_ns[-1] - self.prefill_chunk_ns[-1]

    def phases_ns(self) -> dict[str, int]:
        """Return the time per phase that ran (tokenize, prefill, decode, and engine extras)."""
        out = {name: value for name, value in (("tokenize", self.tokenize_ns),
                                                ("prefill", self.prefill_ns),
                                                ("decode", self.decode_ns)) if value is not None}
        out.update(self.phases_extra_ns)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the stop reason as its string value)."""
        d = asdict(self)
        d["stop_reason"] = self.stop_reason.value
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationTrace:
        """Rebuild a trace from :meth:`to_dict` (e.g. after crossing a process boundary)."""
        kwargs = dict(data)
        kwargs["stop_reason"] = StopReason(kwargs["stop_reason"])
        return cls(**kwargs)


def stop_reason_now(request: GenerationRequest, abort: AbortSignal | None,
                    now_ns: int) -> StopReason | None:
    """Return why a generation must stop at ``now_ns`` (abort asked, deadline passed), or None."""
    if abort is not None and abort.is_set():
        return StopReason.ABORTED
    if request.deadline_ns is not None and now_ns >= request.deadline_ns:
        return StopReason.DEADLINE
    return None


def stop_after_token(request: GenerationRequest, text_bytes: bytes, produced: int,
                     abort: AbortSignal | None, now_ns: int) -> StopReason | None:
    """Return why a generation stops after its ``produced``-th token, or None to go on.

    A stop string in the text so far (DONE), a complete output of the request's contract
    (COMPLETE), the token budget (MAX_TOKENS), then :func:`stop_reason_now` (abort asked,
    deadline passed).
    """
    if request.stop and any(s.encode() in text_bytes for s in request.stop):
        return StopReason.DONE
    if request.complete is not None and output_done(request.complete, text_bytes):
        return StopReason.COMPLETE
    if produced >= request.max_tokens:
        return StopReason.MAX_TOKENS
    return stop_reason_now(request, abort, now_ns)


def output_done(kind: str, text_bytes: bytes) -> bool:
    """Return whether ``text_bytes`` is a complete output of contract ``kind`` (cheap unless the
    last byte can end one)."""
    from robot_latency.profiles.contract import output_complete

    tail = text_bytes.rstrip()
    if not tail or tail[-1:] not in b'}]"el>':
        return False
    return output_complete(kind, text_bytes.decode("utf-8", errors="replace"))


@runtime_checkable
class Engine(Protocol):
    """A batch-1 text generator with per-token timing; a context manager that closes it."""

    name: str

    def generate(self, request: GenerationRequest, *,
                 abort: AbortSignal | None = None) -> GenerationTrace:
        """Generate for ``request``; stop early when ``abort`` is set or the deadline passes."""
        ...

    def info(self) -> dict[str, Any]:
        """Return the engine's configuration, recorded with every run."""
        ...

    def close(self) -> None:
        """Release the model and any other resources (idempotent)."""
        ...

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


_E = TypeVar("_E", bound="ClosesOnExit")


class ClosesOnExit:
    """Makes an engine a context manager: ``with create_engine(...) as engine:`` closes it at
    the end of the block (the engine's own ``close``, idempotent)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


EngineFactory = Callable[..., Engine]

#: Engines by name; each module registers its factory on import. The package's ``__init__``
#: imports every engine module, and Python runs it before this submodule can be imported, so the
#: table is full wherever ``create_engine`` is called from.
ENGINES: dict[str, EngineFactory] = {}


def register_engine(name: str) -> Callable[[EngineFactory], EngineFactory]:
    """Register an engine factory under ``name`` (a decorator)."""
    def deco(factory: EngineFactory) -> EngineFactory:
        ENGINES[name] = factory
        return factory
    return deco


def create_engine(name: str, **options: Any) -> Engine:
    """Create a registered engine by name.

    Raises:
        UnknownEngineError: no engine of that name; the message lists the known ones.
    """
    try:
        factory = ENGINES[name]
    except KeyError:
        known = ", ".join(sorted(ENGINES)) or "none"
        raise UnknownEngineError(f"unknown engine {name!r}; known engines: {known}") from None
    return factory(**options)
