"""Labelled commands: what the operator meant, and whether a plan matches it.

A label is the plan a command should get, in the same JSON form as a record's ``plan``, or the
string ``"refuse"`` for a command the planner must refuse. A label may be partial: a key it leaves
out is not compared (a step may give only ``action`` and ``target``). A plan matches a label when
it has the same number of steps and every step matches, key by key; the comparison is semantic
(two decoded JSON objects: key order and whitespace never count), and the defaults the profile's
schema declares are filled into both sides first. A refusal is judged like any plan: right when the
label says ``refuse``, wrong otherwise; a label that is a plan is never met by a refusal.

Labels come with a stream (a JSONL line's ``expected``) or from a sidecar JSONL file, one
``{"command_id": ..., "expected": ...}`` or ``{"text": ..., "expected": ...}`` per line
(:func:`read_labels`). A label that does not fit the profile's schema is a one-line
:class:`LabelError` naming the file and line.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError
from robot_latency.profiles.actions import REFUSE_ACTION, is_refusal, plan_json_schema
from robot_latency.profiles.normalize import normalize_command

__all__ = [
    "REFUSE_LABEL",
    "Label",
    "LabelError",
    "LabelSet",
    "check_label",
    "default_labels_path",
    "fill_defaults",
    "label_schema",
    "plan_matches",
    "read_labels",
    "stream_labels",
]

#: The label of a command that must be refused.
REFUSE_LABEL = "refuse"


class LabelError(RobotLatencyError, ValueError):
    """A label that cannot be read or does not fit the profile's schema; the message names
    where (file and line, or the command)."""


@dataclass(frozen=True)
class Label:
    """One command's expected outcome.

    Attributes:
        expected: the (possibly partial) plan, or ``"refuse"``.
        schema: the profile's plan schema (for defaults), or None.
    """

    expected: Any
    schema: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def refuse(self) -> bool:
        """Whether the command must be refused."""
        return self.expected == REFUSE_LABEL

    @property
    def kind(self) -> str:
        """The label's class: ``refuse``, else its first step's action (``?`` when it gives
        none): a wrong ``stop`` is the costliest mistake, so the report splits by it."""
        if self.refuse:
            return REFUSE_ACTION
        steps = self.expected.get("steps") if isinstance(self.expected, dict) else None
        if isinstance(steps, list) and steps and isinstance(steps[0], dict):
            return str(steps[0].get("action", "?"))
        return "?"

    def judge(self, plan: Any) -> bool | None:
        """Return whether ``plan`` (the model's, the fallback's or a refusal) is right; None when
        there was no plan at all."""
        if plan is None:
            return None
        return plan_matches(self.expected, plan, schema=self.schema)


def label_schema(contract: Any) -> dict[str, Any]:
    """Return the plan schema labels are checked against: a JSON contract's own schema, else the
    bundled action language's."""
    schema = getattr(contract, "schema", None)
    return schema if isinstance(schema, dict) else plan_json_schema()


def fill_defaults(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """Return a copy of ``value`` with the schema's ``default`` values filled in where a key is
    missing (objects' ``properties``, arrays' ``items``, recursively)."""
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, dict):
        out = dict(value)
        props = schema.get("properties")
        if isinstance(props, Mapping):
            for key, sub in props.items():
                if key not in out and isinstance(sub, Mapping) and "default" in sub:
                    out[key] = copy.deepcopy(sub["default"])
                if key in out:
                    out[key] = fill_defaults(out[key], sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [fill_defaults(v, schema["items"]) for v in value]
    return value


def _partial_match(expected: Any, actual: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _partial_match(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list):
        return (isinstance(actual, list) and len(expected) == len(actual)
                and all(_partial_match(e, a) for e, a in zip(expected, actual, strict=True)))
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    return expected == actual


def plan_matches(expected: Any, plan: Any, *, schema: Mapping[str, Any] | None = None) -> bool:
    """Return whether ``plan`` matches the label ``expected``.

    Args:
        expected: a (partial) plan or ``"refuse"``.
        plan: the published plan, a decoded JSON object.
        schema: the profile's schema, whose defaults are filled into both sides.
    """
    if expected == REFUSE_LABEL:
        return is_refusal(plan)
    if is_refusal(plan):
        return False
    return _partial_match(fill_defaults(expected, schema), fill_defaults(plan, schema))


def _relaxed(schema: Any) -> Any:
    """The schema with every ``required`` dropped and ``oneOf`` read as ``anyOf``: what a partial
    label must fit (each key it gives must be one the schema allows, with an allowed value)."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "required":
                continue
            out["anyOf" if key == "oneOf" else key] = _relaxed(value)
        return out
    if isinstance(schema, list):
        return [_relaxed(v) for v in schema]
    return schema


def check_label(expected: Any, *, schema: Mapping[str, Any], where: str) -> Label:
    """Return the label if it fits the schema.

    Raises:
        LabelError: it does not fit; the message names ``where`` and the first violation.
    """
    import jsonschema

    if expected == REFUSE_LABEL:
        return Label(expected, schema)
    if not isinstance(expected, dict):
        raise LabelError(f"{where}: expected must be a plan object or \"refuse\", "
                         f"got {json.dumps(expected)[:60]}")
    relaxed = _relaxed(dict(schema))
    error = next(iter(jsonschema.validators.validator_for(relaxed)(relaxed).iter_errors(
        expected)), None)
    # inside an anyOf, the branch that came nearest (fewest errors), then its deepest error:
    # which step and which field, not "not valid under any of the given schemas"
    while error is not None and error.context:
        branches: dict[Any, list[Any]] = {}
        for e in error.context:
            branches.setdefault(e.relative_schema_path[0], []).append(e)
        nearest = min(branches.values(),
                      key=lambda es: (len(es), -max(len(e.absolute_path) for e in es)))
        error = max(nearest, key=lambda e: len(e.absolute_path))
    if error is not None:
        at = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise LabelError(f"{where}: the label does not fit the profile's schema at {at}: "
                         f"{error.message.splitlines()[0][:120]}")
    return Label(expected, schema)


@dataclass
class LabelSet:
    """Labels by command id and by command text (normalized).

    ``lookup`` tries the id, then the id before an ``@`` (a replayer's ``ID@PLAY``), then the
    text.
    """

    by_id: dict[str, Label] = field(default_factory=dict)
    by_text: dict[str, Label] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # command id -> text, where known

    def __len__(self) -> int:
        return len(self.by_id) + len(self.by_text)

    def add(self, label: Label, *, command_id: str | None = None, text: str | None = None) -> None:
        if command_id is not None:
            self.by_id[command_id] = label
        if text is not None:
            self.by_text[normalize_command(text)] = label

    def text_of(self, command_id: str | None) -> str | None:
        """Return a labelled command's text (by id, or the id before an ``@``), or None."""
        if command_id is None:
            return None
        return self.texts.get(command_id, self.texts.get(command_id.split("@", 1)[0]))

    def lookup(self, command_id: str | None, text: str | None = None) -> Label | None:
        """Return the label of a command, or None when it is unlabelled."""
        if command_id is not None:
            for key in (command_id, command_id.split("@", 1)[0]):
                if key in self.by_id:
                    return self.by_id[key]
        if text is not None:
            return self.by_text.get(normalize_command(text))
        return None

    def for_commands(self, commands: Iterable[Any]) -> dict[str, Label]:
        """Return ``{command_id: label}`` for the labelled ones of stream commands."""
        out = {}
        for c in commands:
            label = self.lookup(c.command_id, c.text)
            if label is not None:
                out[c.command_id] = label
        return out


#: The sidecar a bag directory's labels are read from when no ``--labels`` is given.
LABELS_NAME = "labels.jsonl"


def default_labels_path(stream: str | Path) -> Path | None:
    """Return a bag directory's own ``labels.jsonl`` (the shipped streams have one), or None."""
    path = Path(stream) / LABELS_NAME
    return path if Path(stream).is_dir() and path.is_file() else None


def read_labels(path: str | Path, *, schema: Mapping[str, Any]) -> LabelSet:
    """Read a sidecar labels file: one ``{"command_id"|"text": ..., "expected": ...}`` per line.

    Raises:
        LabelError: the file cannot be read, a line is not such an object, or a label does not
            fit the schema (one line, naming the file and line).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise LabelError(f"labels file {path}: cannot be read: {err}") from err
    labels = LabelSet()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise LabelError(f"{where}: not JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(obj, dict) or "expected" not in obj:
            raise LabelError(f"{where}: a label line is an object with \"expected\"")
        cid, text = obj.get("command_id"), obj.get("text")
        if not isinstance(cid, str) and not isinstance(text, str):
            raise LabelError(f"{where}: a label line names its command by \"command_id\" or "
                             "\"text\" (a string)")
        labels.add(check_label(obj["expected"], schema=schema, where=where),
                   command_id=cid if isinstance(cid, str) else None,
                   text=text if isinstance(text, str) else None)
    return labels


def stream_labels(commands: Iterable[Any], *, schema: Mapping[str, Any], source: str,
                  sidecar: LabelSet | None = None) -> LabelSet:
    """Return the labels of a stream: each command's own ``expected`` (a JSONL field), then the
    sidecar's by id or text for the rest.

    Raises:
        LabelError: a command's own label does not fit the schema (naming the command).
    """
    labels = LabelSet()
    for c in commands:
        own = getattr(c, "expected", None)
        if own is not None:
            line = getattr(c, "line", None)
            where = f"{source}:{line}" if line else f"{source}: command {c.command_id}"
            label = check_label(own, schema=schema, where=where)
        else:
            label = sidecar.lookup(c.command_id, c.text) if sidecar is not None else None
        if label is not None:
            labels.add(label, command_id=c.command_id)
            labels.texts[c.command_id] = c.text
    return labels

