"""Chat formats: ``raw`` text, or one of llama.cpp's built-in named templates.

The named templates (chatml, llama3, phi3, gemma, ...) are llama.cpp's own C++ renderings
(``llama_chat_apply_template`` with a template *name*), so no Jinja runs: a chat template embedded
in a GGUF is never executed, whoever wrote the file. The list of names comes from the llama.cpp
build itself (``llama_chat_builtin_templates``).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from robot_latency.errors import RobotLatencyError

RAW = "raw"


class ChatFormatError(RobotLatencyError, ValueError):
    """An unknown chat format, or a conversation llama.cpp cannot render with it."""


@dataclass(frozen=True)
class Message:
    """One chat turn: ``role`` is ``system``, ``user`` or ``assistant``."""

    role: str
    content: str


@functools.lru_cache(maxsize=1)
def builtin_templates() -> tuple[str, ...]:
    """Return the names of llama.cpp's built-in chat templates, sorted."""
    import llama_cpp

    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    if n <= 0:
        return ()
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    return tuple(sorted(s.decode() for s in names if s))


def known_formats() -> tuple[str, ...]:
    """Return every chat format a profile may name: ``raw`` and llama.cpp's built-in ones."""
    return (RAW, *builtin_templates())


def check_format(name: str) -> str:
    """Return ``name`` if it is a known chat format.

    Raises:
        ChatFormatError: it is not; the message lists the known ones.
    """
    if name != RAW and name not in builtin_templates():
        raise ChatFormatError(f"unknown chat format {name!r}; known: "
                              f"{', '.join(known_formats())}")
    return name


def render(name: str, messages: Sequence[Message], *, add_assistant: bool) -> str:
    """Render a conversation with a built-in template.

    Args:
        name: a name from :func:`builtin_templates`.
        messages: the turns, in order.
        add_assistant: end with the opening of the assistant's turn (the generation prompt).

    Raises:
        ChatFormatError: an unknown name, or a conversation the template refuses.
    """
    import llama_cpp

    check_format(name)
    if name == RAW:
        raise ChatFormatError("render: the raw format has no template")
    # Keep the encoded strings alive for the duration of the call.
    encoded = [(m.role.encode(), m.content.encode()) for m in messages]
    chat = (llama_cpp.llama_chat_message * len(encoded))(
        *(llama_cpp.llama_chat_message(role=r, content=c) for r, c in encoded))
    size = 256 + 2 * sum(len(r) + len(c) for r, c in encoded)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(encoded),
                                                add_assistant, buf, size)
        if n < 0:
            raise ChatFormatError(f"chat format {name!r}: llama.cpp could not render this "
                                  f"conversation ({len(encoded)} turns)")
        if n <= size:
            return buf.raw[:n].decode("utf-8")
        size = n + 1
    raise ChatFormatError(f"chat format {name!r}: rendering did not fit its buffer")
