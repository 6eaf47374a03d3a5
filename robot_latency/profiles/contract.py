"""Output contracts: what the model must write, the grammar that constrains it, and its parser.

- ``actions``: the bundled planner's action tokens (:mod:`robot_latency.profiles.actions`), parsed
  and expanded to the JSON plan.
- ``json``: a JSON object under a JSON Schema. Decoding is constrained by the GBNF grammar that
  llama-cpp-python derives from the schema (``llama_grammar.json_schema_to_gbnf``); the output is
  parsed and validated with the ``jsonschema`` library, and the schema-valid object is the plan.
  The grammar admits compact JSON only (no optional whitespace), so a plan's length in tokens is
  bounded by the schema.

Either way :meth:`OutputContract.parse` returns the plan as a JSON object (a dict) or raises
:class:`~robot_latency.profiles.actions.PlanParseError` with what was wrong, which the loop records
as an ``invalid_output`` fallback with the raw text kept.

A generation ends as soon as its output is complete (:func:`output_complete`: nothing the
contract allows can follow), and :func:`complete_plan` is the one question every engine and the
loop ask of a partial output: "is this already a complete, valid plan?".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from robot_latency.errors import RobotLatencyError
from robot_latency.profiles.actions import (
    END_TOKEN,
    PlanParseError,
    actions_gbnf,
    expand_to_plan,
    parse_actions,
)

CONTRACTS = ("actions", "json")
_SPACE_RULE = re.compile(r"^space ::= .*$", re.M)


class ContractError(RobotLatencyError, ValueError):
    """A contract that cannot be built: a schema file missing, not JSON, or not a valid schema."""


class OutputContract(Protocol):
    """Turns the model's text into a plan object."""

    kind: str
    grammar: str | None  # GBNF constraining decoding, or None

    def parse(self, text: str) -> dict[str, Any]: ...

    def validate(self, plan: Any) -> dict[str, Any]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass
class ActionsContract:
    """The bundled action language; ``grammar=False`` decodes unconstrained."""

    use_grammar: bool = True
    kind: str = "actions"
    grammar: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.grammar = actions_gbnf() if self.use_grammar else None

    def parse(self, text: str) -> dict[str, Any]:
        """Parse action tokens into the expanded plan.

        Raises:
            PlanParseError: the text breaks the action language.
        """
        steps = parse_actions(text)
        return expand_to_plan(steps)

    def validate(self, plan: Any) -> dict[str, Any]:
        """Check a plan object (a fallback's) against the expanded plan's form."""
        from robot_latency.profiles.actions import validate_plan

        validate_plan(plan)
        return plan

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "grammar": self.grammar is not None}


class JsonContract:
    """A JSON object under a JSON Schema.

    Args:
        schema: the schema (a dict), or a path to its file.
        use_grammar: constrain decoding by the schema's GBNF.

    Raises:
        ContractError: the file is missing or not JSON, or the schema is not a valid JSON Schema,
            or llama-cpp-python cannot turn it into a grammar.
    """

    kind = "json"

    def __init__(self, schema: dict[str, Any] | str | Path, *, use_grammar: bool = True) -> None:
        import jsonschema

        self.schema_path: str | None = None
        if not isinstance(schema, dict):
            self.schema_path = str(schema)
            path = Path(schema)
            try:
                schema = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError as err:
                raise ContractError(f"schema file {path}: no such file") from err
            except (OSError, UnicodeDecodeError) as err:
                raise ContractError(f"schema file {path}: cannot be read: {err}") from err
            except json.JSONDecodeError as err:
                raise ContractError(f"schema file {path}: not JSON: {err}") from err
        where = self.schema_path or "schema"
        if not isinstance(schema, dict):
            raise ContractError(f"{where}: a JSON Schema must be an object, got "
                                f"{type(schema).__name__}")
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as err:
            raise ContractError(f"{where}: not a valid JSON Schema: {err.message}") from err
        self.schema = schema
        self._validator = cls(schema)
        self.grammar: str | None = None
        if use_grammar:
            from llama_cpp.llama_grammar import json_schema_to_gbnf

            try:
                grammar = json_schema_to_gbnf(json.dumps(schema))
            except Exception as err:  # the converter raises plain Exceptions on what it lacks
                raise ContractError(f"{where}: llama-cpp-python cannot derive a grammar from "
                                    f"this schema: {err}") from err
            # Compact JSON: the converter allows an optional space after every punctuation
            # mark, which a weak or quantized model takes often enough to double its output
            # length; one fixed spelling keeps a plan within its token budget.
            self.grammar = _SPACE_RULE.sub('space ::= ""', grammar, count=1)

    def validate(self, plan: Any) -> dict[str, Any]:
        """Return ``plan`` if the schema accepts it.

        Raises:
            PlanParseError: it breaks the schema (the message gives the first violation).
        """
        error = next(iter(self._validator.iter_errors(plan)), None)
        if error is not None:
            at = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise PlanParseError(f"schema violation at {at}: {error.message}")
        if not isinstance(plan, dict):
            raise PlanParseError(f"a plan must be a JSON object, got {type(plan).__name__}")
        return plan

    def parse(self, text: str) -> dict[str, Any]:
        """Parse the model's text as JSON and validate it.

        Raises:
            PlanParseError: not JSON, or JSON the schema rejects.
        """
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise PlanParseError(f"not JSON: {err.msg} at character {err.pos}") from err
        return self.validate(obj)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "grammar": self.grammar is not None,
                "schema_path": self.schema_path, "schema": self.schema}


#: The last character a complete top-level JSON value can end with (a bare number never is
#: complete while it streams: "1" may become "12").
_JSON_ENDS = frozenset('}]"el')


def output_complete(kind: str, text: str) -> bool:
    """Return whether ``text`` is a complete output of contract ``kind``: nothing can follow.

    ``json``: one complete JSON value (an object's closing brace, say), whitespace around it
    allowed. ``actions``: the text carries the end token. A plan's validity is not checked
    here (:func:`complete_plan` does); completeness alone says that generating further cannot
    help, so an engine may stop.
    """
    if kind == "json":
        body = text.strip()
        if not body or body[-1] not in _JSON_ENDS:
            return False
        try:
            json.loads(body)
        except json.JSONDecodeError:
            return False
        return True
    if kind == "actions":
        return END_TOKEN in text
    return False


def complete_plan(contract: OutputContract, text: str) -> dict[str, Any] | None:
    """Return the plan when ``text`` is already a complete output the contract accepts.

    The check an engine runs after each token and the loop runs on whatever a generation
    returned: a complete JSON value valid under the schema, or a complete action plan. None
    when the output is incomplete or invalid.
    """
    if not output_complete(contract.kind, text):
        return None
    try:
        return contract.parse(text)
    except PlanParseError:
        return None
