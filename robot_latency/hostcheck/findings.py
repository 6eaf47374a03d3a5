"""The doctor's findings and input: a check's OK/WARN/FAIL with its fix, what the checks run
against, and the node params file they read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from robot_latency.errors import RobotLatencyError

__all__ = ["FAIL", "OK", "WARN", "Check", "DoctorError", "DoctorInput", "load_params"]

OK, WARN, FAIL = "OK", "WARN", "FAIL"


class DoctorError(RobotLatencyError):
    """Bad input to the doctor (a params file that cannot be read)."""


@dataclass(frozen=True)
class Check:
    """One finding.

    Attributes:
        name: what was checked (``jetson``, ``ros``, ``llama.cpp``, ...).
        status: OK, WARN or FAIL.
        detail: what was found.
        fix: what to do about it ("" when nothing).
    """

    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        """Return the one-line form: ``STATUS name: detail (fix: ...)``."""
        return f"{self.status:<4} {self.name}: {self.detail}" + (
            f"\n     fix: {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class DoctorInput:
    """What the checks run against.

    Attributes:
        root: where device files are read (``/`` here, a fixture tree in tests).
        params_file: a node params file (``config/*.yaml``), or None for the defaults.
        model: the GGUF whose size is checked against free memory, or None: the params file's
            model, else the bundled planner.
        cache_dir: the model cache, or None for the default.
        overrides: settings given as flags, the same names as the params file's (``model``,
            ``quant``, ``engine``, ``loop_cpus``, ``engine_cpus``, ``loop_priority``); they win
            over the params file, as they do for ``run``.
        quant: the model's ladder level (``run --quant``): its built file is checked.
        run_dir: a finished run whose late fallbacks are weighed against an unpinned loop.
    """

    root: Path = Path("/")
    params_file: Path | None = None
    model: Path | None = None
    cache_dir: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    quant: str | None = None
    run_dir: Path | None = None


def load_params(path: Path | None) -> dict[str, Any]:
    """Return the ``ros__parameters`` of a params file's first node ({} for None).

    Raises:
        DoctorError: the file cannot be read or has no ``ros__parameters``.
    """
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise DoctorError(f"params file {path}: cannot read it: {err}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        why = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise DoctorError(f"params file {path}:{where} not valid YAML: {why}") from err
    if isinstance(data, dict):
        for node in data.values():
            if isinstance(node, dict) and isinstance(node.get("ros__parameters"), dict):
                return node["ros__parameters"]
    raise DoctorError(f"params file {path}: no '<node>: ros__parameters:' mapping")

