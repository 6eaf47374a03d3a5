"""The ``openai`` engine's settings, its fault names, what a stream chunk carries, and the server
checks that need no engine.

:class:`OpenAIServerConfig` is validated in one place; :func:`fault_of` names the fault an
exception from the client means (:data:`SERVER_FAULTS`, the fallback reasons the planner records);
:func:`read_chunk` says what one chunk of a stream carries;
:func:`check_server` is a front end's start-up check of a URL. The engine is
:mod:`robot_latency.engines.openai_server`.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from robot_latency.engines.base import EngineError

#: The server APIs the engine speaks.
SERVER_APIS = ("completions", "chat")
#: How the output contract reaches the server (docs/OFFBOARD.md).
SERVER_KINDS = ("auto", "llamacpp", "vllm", "generic")
#: Fallback reasons a server fault gives (besides the deadline).
SERVER_FAULTS = ("server_unreachable", "server_error", "server_malformed", "invalid_output")


class ServerCheckError(EngineError):
    """A server that does not answer at start-up; the message names the URL."""


@dataclass(frozen=True)
class OpenAIServerConfig:
    """Settings of the ``openai`` engine.

    Args:
        server_url: the server's OpenAI base URL (``http://host:port/v1``; ``/v1`` is added when
            the path is empty).
        server_model: the model name to ask for; empty: the first one the server lists.
        server_api: ``completions`` (the profile's rendered prompt text) or ``chat`` (its
            messages; the server applies its chat template).
        server_kind: how the output contract is sent: ``llamacpp`` (GBNF ``grammar``), ``vllm``
            or ``generic`` (``response_format`` json_schema), ``auto`` (from ``/v1/models``).
        profile: the planner profile (name or path) whose output contract is sent and checked.
        grammar: send the profile's grammar (the planner's ``grammar`` setting).
        api_key_env: environment variable holding the API key (unset: a placeholder key).
        connect_timeout_s: longest wait for a TCP connection (a request still ends at its
            deadline).
        check_timeout_s: longest wait for the start-up check.
        request_extra: further fields for every request body (a server's own options, e.g.
            ``{"top_k": 1}``); they override the contract's fields of the same name.
    """

    server_url: str
    server_model: str = ""
    server_api: str = "completions"
    server_kind: str = "auto"
    profile: str | None = None
    grammar: bool = True
    api_key_env: str = "ROBOT_LATENCY_API_KEY"
    connect_timeout_s: float = 2.0
    check_timeout_s: float = 3.0
    request_extra: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.server_url:
            raise EngineError("openai: server_url must be set (e.g. http://127.0.0.1:8000/v1)")
        parts = urlsplit(self.server_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineError(f"openai: server_url={self.server_url!r}: expected "
                              "http://HOST:PORT[/v1]")
        if self.server_api not in SERVER_APIS:
            raise EngineError(f"openai: server_api={self.server_api!r}: must be one of "
                              f"{SERVER_APIS}")
        if self.server_kind not in SERVER_KINDS:
            raise EngineError(f"openai: server_kind={self.server_kind!r}: must be one of "
                              f"{SERVER_KINDS}")

    @property
    def base_url(self) -> str:
        """The URL with ``/v1`` when none was given."""
        url = self.server_url.rstrip("/")
        return url if urlsplit(url).path not in ("", "/") else url + "/v1"


def fault_of(err: BaseException) -> tuple[str, str]:
    """Return (fault, message) for an exception raised while talking to the server."""
    import httpx
    import openai

    cause = err.__cause__ or err.__context__
    if isinstance(err, openai.APIStatusError):
        return "server_error", f"HTTP {err.status_code}: {err.message}"
    if isinstance(err, openai.APITimeoutError):
        return "server_unreachable", "connection timed out"
    if isinstance(err, openai.APIConnectionError):
        chain = [err, cause, getattr(cause, "__cause__", None), getattr(cause, "__context__",
                                                                        None)]
        if any(isinstance(c, socket.gaierror) for c in chain) or "resolution" in str(cause) \
                or "not known" in str(cause) or "getaddrinfo" in str(cause):
            return "server_unreachable", f"name does not resolve: {cause}"
        if isinstance(cause, httpx.ConnectError):
            return "server_unreachable", f"cannot connect: {cause}"
        return "server_error", f"connection lost: {cause or err}"
    if isinstance(err, openai.APIError):  # an error object inside the stream
        return "server_error", f"error in stream: {err.message}"
    if isinstance(err, httpx.HTTPError):  # raised while iterating an open stream
        return "server_error", f"stream broken: {type(err).__name__}: {err}"
    if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
                        AttributeError, IndexError, ValueError)):
        return "server_malformed", f"malformed stream data: {type(err).__name__}: {err}"
    return "server_error", f"{type(err).__name__}: {err}"


def read_chunk(chunk: Any, api: str) -> tuple[str, str | None, dict[str, Any] | None]:
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


def check_server(url: str, *, timeout_s: float = 3.0) -> list[str]:
    """Return the models a server lists, for a front end's start-up check.

    Raises:
        ServerCheckError: the server does not answer (one line naming the URL).
    """
    import httpx

    config = OpenAIServerConfig(server_url=url)
    key = os.environ.get(config.api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(config.base_url + "/models", timeout=timeout_s, headers=headers)
        response.raise_for_status()
        data = response.json().get("data", [])
        return [str(m.get("id")) for m in data if isinstance(m, dict)]
    except httpx.HTTPStatusError as err:
        raise ServerCheckError(f"server {config.base_url} answered HTTP "
                               f"{err.response.status_code} to GET /models") from err
    except (httpx.HTTPError, ValueError, AttributeError) as err:
        raise ServerCheckError(f"server {config.base_url} is unreachable: "
                               f"{type(err).__name__}: {err}") from err
