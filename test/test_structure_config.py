"""One run configuration path: two dataclasses carry a run's settings, each default written once.

How a carrier is found: every dataclass in robot_latency/ (by ast, so nothing is imported) that
declares a field named ``deadline_ms`` or ``engine`` itself is a carrier of run settings, except

- the modules under report/ and floor/: they describe finished runs and published measurements
  (a comparison row's engine, a published row's engine), read back, never set by a user;
- :data:`EXEMPT`, each with its reason.

A dataclass that holds a carrier (``FleetSpec.settings``, ``PlannerSettings.run``) copies no
field and is no carrier. The carriers must be ``RunSettings`` alone; with ``ResolvedRun`` (the
settings plus what the builder resolved, no setting of its own) that makes two.

How "written once" is checked: for every field of RunSettings whose default is a literal (not
0, "", None, False or True, which say "none" in many unrelated places), the run path's modules
(planner/, cli/, ros/, demo.py) are searched for that literal given as that setting's default:
``name: T = literal``, ``def f(name=literal)``, ``f(name=literal)``, a ROS parameter spec
``_spec("name", literal, ...)`` or a flag ``add_argument("--name", default=literal)``. It may
appear once: in planner/config.py. The target device's name is also checked as a plain string:
it appears in one module of the run path.
"""

from __future__ import annotations

import ast
from pathlib import Path

from robot_latency.planner.config import RunSettings
from robot_latency.planner.resolve import ResolvedRun
from robot_latency.ros.params import PARAM_OF

PACKAGE = Path(__file__).resolve().parents[1] / "robot_latency"
#: Dataclasses with a ``deadline_ms`` or ``engine`` field that carry no run settings, and why.
EXEMPT = {
    "ReplayerSettings": "the bag replayer node's own settings: the deadline it measures the "
                        "plan's arrival against, not a planner run's",
    "MainJob": "the demo's job (levels to build, stream, speed); each level's run goes to the "
               "planner node as parameters, so through the builder",
    "TargetAnswer": "a result: the deadline the loop was simulated at on the target (the "
                    "simulation reads the run's RunSettings)",
    "RateAnswer": "a result: the deadline the capacity search held the miss rate at, on the "
                  "target (the simulation reads the run's RunSettings)",
    "UntimedPass": "a record: the engine that ran the untimed pass, kept with its facts",
}
RUN_PATH = [p for p in sorted(PACKAGE.rglob("*.py"))
            if p.parent.name in ("planner", "cli", "ros") or p.name == "demo.py"]


def _dataclasses() -> list[tuple[Path, ast.ClassDef, set[str]]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list):
                names = {s.target.id for s in node.body
                         if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                out.append((path, node, names))
    return out


def test_two_dataclasses_at_most_carry_the_run_settings() -> None:
    carriers = sorted(
        node.name for path, node, names in _dataclasses()
        if names & {"deadline_ms", "engine"} and node.name not in EXEMPT
        and not ({"report", "floor"} & set(path.relative_to(PACKAGE).parts[:-1])))
    assert carriers == ["RunSettings"], f"run settings carried by {carriers}"
    resolved = {f for f in ResolvedRun.__dataclass_fields__}
    assert "settings" in resolved and not resolved & {"deadline_ms", "engine", "log_dir"}
    assert len({"RunSettings", "ResolvedRun", *carriers}) <= 2


def test_the_exempt_ones_still_exist() -> None:
    names = {node.name for _, node, _ in _dataclasses()}
    assert set(EXEMPT) <= names, "an exemption for a class that is gone: remove it"


def _literal_defaults() -> dict[str, object]:
    out = {}
    for name, f in RunSettings.__dataclass_fields__.items():
        value = f.default
        if isinstance(value, (int, float, str)) and not isinstance(value, bool) \
                and value not in (0, "", 0.0):
            out[name] = value
    return out


def _is(node: ast.AST | None, value: object) -> bool:
    return (isinstance(node, ast.Constant) and type(node.value) is type(value)
            and node.value == value)


def _writes(tree: ast.AST, name: str, value: object) -> int:
    """Count the places in ``tree`` that give ``value`` as the default of setting ``name``."""
    spellings = {name, "--" + name.replace("_", "-"), PARAM_OF.get(name, name)}
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id == name and _is(node.value, value):
            n += 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                       if d is not None]
            n += sum(arg.arg == name and _is(d, value) for arg, d in pairs)
        elif isinstance(node, ast.Call):
            n += sum(k.arg == name and _is(k.value, value) for k in node.keywords)
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and first.value in spellings:
                given = [k.value for k in node.keywords if k.arg == "default"]
                given += node.args[1:2]
                n += any(_is(d, value) for d in given)
    return n


def test_each_default_is_written_once() -> None:
    defaults = _literal_defaults()
    assert {"target_device", "hang_timeout_ms", "engine", "deadline_ms"} <= set(defaults)
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in RUN_PATH}
    for name, value in defaults.items():
        where = {str(p.relative_to(PACKAGE)): c for p, t in trees.items()
                 if (c := _writes(t, name, value))}
        # config.py writes it once, or names a constant written once (DEFAULT_...)
        assert set(where) <= {"planner/config.py"} and sum(where.values()) <= 1, \
            f"default of {name}={value!r} written in {where}"


def test_the_default_target_device_is_named_in_one_module() -> None:
    device = RunSettings().target_device
    where = [str(p.relative_to(PACKAGE)) for p in RUN_PATH
             if any(_is(n, device) for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))]
    assert where == ["planner/config.py"]


def test_the_checks_see_a_second_writing() -> None:
    """The search itself: it finds a default written again in each form it knows."""
    code = ('x: float = 1000.0\n'
            'def f(hang_timeout_ms=1000.0): ...\n'
            'g(hang_timeout_ms=1000.0)\n'
            '_spec("hang_timeout_ms", 1000.0, "double", "")\n'
            'p.add_argument("--hang-timeout-ms", default=1000.0)\n'
            'p.add_argument("--device", default="x")\n')
    assert _writes(ast.parse(code), "hang_timeout_ms", 1000.0) == 4
    assert _writes(ast.parse('_spec("planner_profile", "orin", "string", "")'),
                   "profile", "orin") == 1
