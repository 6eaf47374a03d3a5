"""The README and docs/ cannot drift from the code.

- Every fenced block has a language, and the test knows what each language means: ``bash`` and
  ``console`` (``$ `` lines) hold commands, every other block is not run (``text`` for output,
  ``python``, ``yaml``, ``json`` and ``jsonl`` are parsed).
- Every command is checked: ``robot-latency`` arguments are parsed by the command's own argparse
  parser (the cheap commands, ``predict`` and ``floor`` on a preset..., are also run, and a
  ``console`` excerpt's output lines must be lines of the real output); ``make`` targets exist;
  ``ros2 launch`` arguments are ones the launch file declares; ``ros2 run`` and the venv's console
  scripts are setup.py's, with parameters the nodes declare; ``python -m`` modules exist. A
  command of no known kind fails the test, so a new one gets a rule.
- Every repository path the docs name exists (a glob matches something).
- The README stays a path (at most 300 lines) that links every document in docs/.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import itertools
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from robot_latency.cli import build_parser, main
from robot_latency.cli.launch import launch_arguments as launch_arguments_of
from robot_latency.launcher import LaunchError, plan_launch
from robot_latency.ros.params import PLANNER_NAMES
from robot_latency.ros.replayer_params import REPLAYER_NAMES

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: The languages a fence may name; the first two hold commands.
COMMAND_LANGS = ("bash", "console")
OTHER_LANGS = ("text", "python", "yaml", "json", "jsonl")
#: Tools that are not the project's: named in install steps, nothing of ours to check in them.
EXTERNAL = {"sudo", "apt", "source", "mkdir", "cd", "git", "rosdep", "export", "echo", "tee",
            "vllm", "cp"}
#: ros2 verbs that need only a running graph (ros2cli's own), not a file of ours.
ROS2_GRAPH_VERBS = {"lifecycle", "topic", "param", "bag", "pkg", "node", "action", "service"}
#: The nodes' console scripts and the parameters each declares.
NODE_PARAMS = {"planner_node": PLANNER_NAMES, "managed_planner_node": PLANNER_NAMES,
               "bag_replayer": REPLAYER_NAMES}
#: robot-latency subcommands cheap enough to run here (no model build, no timed run).
RUNNABLE = {"predict", "floor", "devices", "specdec", "profiles", "model"}
#: Options that make a command write files or need a prepared input: such lines are parsed only.
NOT_RUN_OPTIONS = {"--out", "--plot", "--trace", "--stream", "--validate", "--calibration"}
#: Where a path the docs name may live (README paths from the root; ARCHITECTURE.md's from the
#: package).
PATH_BASES = (ROOT, ROOT / "robot_latency")
PATH_RE = re.compile(
    r"(?<![\w/.~$-])((?:robot_latency_interfaces|robot_latency|docs|test|bench|config|launch|"
    r"requirements|resource|\.ci)/[\w.*/-]*[\w*])")
#: A path of the package's own tree, as ARCHITECTURE.md names them (``planner/loop.py``), or a
#: module's bare file name (``stats.py``).
PKG_PATH_RE = re.compile(r"`((?:[a-z_]+/)*[a-z_]+\.py)`")
#: Paths the docs name that are not (yet) files of this repository, each with the reason.
NOT_HERE = {
    "docs/benchmarks.md": "REFERENCE.md cites it in another repository (a source)",
    "docs/proofs/jetson-bench.md": "REFERENCE.md cites it in another repository (a source)",
    "docs/archive/jetson-development-2025-11/MODEL_INVENTORY_AND_":
        "REFERENCE.md cites it in another repository (a source)",
    "docs/bench/predict_gpu.json": "bench/predict_gpu.py writes it on a machine with a GPU",
}


@dataclass
class Block:
    """One fenced block of a document."""

    doc: Path
    line: int
    lang: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


@dataclass
class Command:
    """One command of a block, continuations joined; ``output`` is a console excerpt's."""

    block: Block
    text: str
    output: list[str] = field(default_factory=list)


def blocks(doc: Path) -> list[Block]:
    """Return the fenced blocks of ``doc``."""
    out: list[Block] = []
    lines = doc.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start, body = lines[i][3:].strip(), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append(Block(doc, start, lang, "\n".join(body)))
        i += 1
    return out


ALL_BLOCKS = [b for doc in DOCS for b in blocks(doc)]


def commands(block: Block) -> list[Command]:
    """Return the commands of a bash or console block."""
    out: list[Command] = []
    current: str | None = None
    for line in block.body.splitlines():
        if current is not None:
            current += " " + line.rstrip("\\").strip()
            if not line.endswith("\\"):
                out.append(Command(block, current.strip()))
                current = None
            continue
        if block.lang == "console" and not line.startswith("$ "):
            if out and line.strip():
                out[-1].output.append(line)
            continue
        text = line[2:] if block.lang == "console" else line
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if text.endswith("\\"):
            current = text.rstrip("\\")
        else:
            out.append(Command(block, text.strip()))
    assert current is None, f"{block.where}: a continued line never ends"
    return out


ALL_COMMANDS = [c for b in ALL_BLOCKS if b.lang in COMMAND_LANGS for c in commands(b)]


def _without_substitutions(text: str) -> str:
    """Replace each ``$(...)`` with ``SUBST``: what it runs is checked where it is written."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$(", i):
            depth, i = 1, i + 2
            while i < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            out.append("SUBST")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def simple_commands(text: str) -> list[list[str]]:
    """Split a command line on ``&&``, ``;`` and ``|`` into argument lists, comments dropped."""
    lexer = shlex.shlex(_without_substitutions(text), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", ";", "|", "||"):
            out.append([])
        else:
            out[-1].append(token)
    for argv in out:  # leading VAR=value assignments and sudo are not the command
        while argv and (re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]) or argv[0] == "sudo"):
            argv.pop(0)
    return [argv for argv in out if argv]


# -------------------------------------------------------------------------------------------------
# What each kind of command must satisfy
# -------------------------------------------------------------------------------------------------


def parse_cli(argv: list[str], where: str) -> argparse.Namespace:
    """Parse ``robot-latency`` arguments with the command's own parser, without running; a
    ``launch`` line's arguments are also checked against its launch file."""
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit as exit_:
        raise AssertionError(f"{where}: robot-latency {' '.join(argv)}: argparse refused it "
                             f"(exit {exit_.code})") from None
    assert not unknown, f"{where}: robot-latency {' '.join(argv)}: unknown arguments {unknown}"
    if args.command == "launch":
        try:
            plan_launch(args.name, launch_arguments_of(args))
        except LaunchError as err:
            raise AssertionError(f"{where}: {err}") from None
    return args


def _is_missing_path(arg: str) -> bool:
    value = arg.split("=", 1)[-1]
    looks_like_file = "/" in value or value.endswith((".gguf", ".json", ".yaml", ".png"))
    return looks_like_file and not (ROOT / value).exists()


def runnable(argv: list[str]) -> bool:
    """Whether a ``robot-latency`` line is cheap and self-contained enough to run here."""
    if argv[:1] == ["launch"]:  # printing the commands costs nothing; running them is a test
        return "--dry-run" in argv  # of its own (test_launcher.py)
    return (bool(argv) and argv[0] in RUNNABLE
            and not any(a.split("=", 1)[0] in NOT_RUN_OPTIONS for a in argv)
            and not any(_is_missing_path(a) for a in argv[1:])
            and "auto" not in argv)


def launch_arguments(launch_file: Path) -> set[str]:
    """Return the arguments a launch file declares (literal names and its name tables)."""
    tree = ast.parse(launch_file.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.endswith(("PARAMETERS", "ARGUMENTS"))
                for t in node.targets):
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            names |= {i.value for i in items if isinstance(i, ast.Constant)}
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "DeclareLaunchArgument"
                and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
    return names


def console_scripts() -> set[str]:
    """Return the console scripts setup.py installs."""
    text = (ROOT / "setup.py").read_text(encoding="utf-8")
    return set(re.findall(r'"([\w-]+) = robot_latency[\w.]*:\w+"', text))


def check_ros_args(exe: str, args: list[str], where: str) -> None:
    """Check a node's ``--ros-args``: declared parameters, params files that exist."""
    assert exe in console_scripts(), f"{where}: {exe} is no console script of setup.py"
    if "--ros-args" not in args:
        return
    rest = args[args.index("--ros-args") + 1:]
    for flag, value in itertools.pairwise(rest):
        if flag == "-p":
            name = value.split(":=", 1)[0]
            assert name in NODE_PARAMS[exe], f"{where}: {exe} declares no parameter {name!r}"
        if flag == "--params-file" and not value.startswith(("SUBST", "install/", "/", "~")):
            assert (ROOT / value).is_file(), f"{where}: no params file {value}"


def check_command(cmd: Command, argv: list[str]) -> None:
    """Fail unless ``argv`` is a command of a known kind that satisfies its rule."""
    where, exe = cmd.block.where, argv[0]
    if exe == "robot-latency":
        parse_cli(argv[1:], where)
    elif exe == "make":
        targets = re.findall(r"^([a-zA-Z][\w.-]*):", (ROOT / "Makefile").read_text(), re.M)
        for target in (a for a in argv[1:] if "=" not in a and not a.startswith("-")):
            assert target in targets, f"{where}: make has no target {target!r}"
    elif exe in ("python", "python3"):
        if "-m" in argv:
            module = argv[argv.index("-m") + 1]
            assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
    elif exe == "ros2":
        verb = argv[1]
        if verb == "launch":
            assert argv[2] == "robot_latency", f"{where}: launches another package"
            launch_file = ROOT / "launch" / argv[3]
            assert launch_file.is_file(), f"{where}: no launch file {argv[3]}"
            declared = launch_arguments(launch_file)
            for arg in argv[4:]:
                name = arg.split(":=", 1)[0]
                assert ":=" in arg and name in declared, \
                    f"{where}: {argv[3]} declares no argument {name!r}"
        elif verb == "run":
            assert argv[2] == "robot_latency", f"{where}: runs another package"
            if argv[3] == "robot-latency":
                parse_cli(argv[4:], where)
            else:
                check_ros_args(argv[3], argv[4:], where)
        else:
            assert verb in ROS2_GRAPH_VERBS, f"{where}: ros2 {verb}: no rule for it"
    elif exe.startswith(".venv/bin/"):
        name = exe.removeprefix(".venv/bin/")
        if name == "robot-latency":
            parse_cli(argv[1:], where)
        else:
            check_ros_args(name, argv[1:], where)
    elif exe == "colcon":
        paths = argv[argv.index("--base-paths") + 1:] if "--base-paths" in argv else []
        for path in paths:
            inside = path.removeprefix("src/robot_latency").lstrip("/")
            assert (ROOT / inside).is_dir(), f"{where}: colcon base path {path} is no folder here"
    else:
        assert exe in EXTERNAL, (f"{where}: {' '.join(argv)}: no rule for {exe!r} (add one to "
                                 "test/test_docs.py, or mark the block ```text)")


# -------------------------------------------------------------------------------------------------
# Tests
# -------------------------------------------------------------------------------------------------


def test_every_fence_names_a_language_the_test_knows() -> None:
    unknown = [f"{b.where}: ```{b.lang}" for b in ALL_BLOCKS
               if b.lang not in COMMAND_LANGS + OTHER_LANGS]
    assert not unknown, "fences without a known language (output: ```text): " + ", ".join(unknown)


def test_the_docs_hold_commands_of_every_kind() -> None:
    kinds = {argv[0] if argv[0] != "ros2" else f"ros2 {argv[1]}"
             for c in ALL_COMMANDS for argv in simple_commands(c.text)}
    assert {"robot-latency", "make", "ros2 launch", "ros2 run", ".venv/bin/planner_node",
            ".venv/bin/bag_replayer"} <= kinds


@pytest.mark.parametrize("cmd", ALL_COMMANDS, ids=lambda c: f"{c.block.where}:{c.text[:40]}")
def test_every_command_parses(cmd: Command) -> None:
    for argv in simple_commands(cmd.text):
        check_command(cmd, argv)


RUN_COMMANDS = [c for c in ALL_COMMANDS
                if (argv := simple_commands(c.text)[0])[0] in ("robot-latency",
                                                               ".venv/bin/robot-latency")
                and runnable(argv[1:])]


def test_some_commands_are_run() -> None:
    ran = {simple_commands(c.text)[0][1] for c in RUN_COMMANDS}
    assert {"predict", "floor", "launch"} <= ran


@pytest.mark.parametrize("cmd", RUN_COMMANDS, ids=lambda c: f"{c.block.where}:{c.text[:40]}")
def test_cheap_commands_run_and_print_their_excerpt(cmd: Command,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    argv = simple_commands(cmd.text)[0][1:]
    assert main(argv) == 0, f"{cmd.block.where}: robot-latency {' '.join(argv)} failed"
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    for line in cmd.output:
        excerpt = line.rstrip()
        if "..." in excerpt:  # an elided line: what comes before the dots
            head = excerpt.split("...", 1)[0].rstrip(" ,;(")
            assert not head.strip() or any(p.startswith(head) for p in printed), \
                f"{cmd.block.where}: no printed line starts {head!r}"
        else:
            assert excerpt in printed, f"{cmd.block.where}: the excerpt's {excerpt!r} is not " \
                                       "what the command prints now"


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang in OTHER_LANGS[1:]],
                         ids=lambda b: b.where)
def test_code_and_data_blocks_parse(block: Block) -> None:
    if block.lang == "python":
        compile(block.body, block.where, "exec")
    elif block.lang == "yaml":
        assert isinstance(yaml.safe_load(block.body), dict), block.where
    elif block.lang == "json":
        json.loads(block.body)
    else:
        for line in filter(str.strip, block.body.splitlines()):
            json.loads(line)


def named_paths(doc: Path) -> set[str]:
    """Return the repository paths ``doc`` names (plain, in backticks or as links)."""
    text = doc.read_text(encoding="utf-8")
    names = set(PATH_RE.findall(text)) | set(PKG_PATH_RE.findall(text))
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    names |= {str((doc.parent / link).resolve().relative_to(ROOT)) for link in links
              if "://" not in link}
    return names


def _exists(name: str) -> bool:
    if name in NOT_HERE:
        return True
    if "/" not in name:  # a module's bare file name: anywhere in the repository
        return any(p for p in ROOT.rglob(name) if ".venv" not in p.parts)
    if re.fullmatch(r"robot_latency_interfaces/(msg|action|srv)/\w+", name):  # a ROS type
        kind = name.split("/")[1]
        return (ROOT / f"{name}.{kind}").is_file()
    for base in PATH_BASES:
        if "*" in name:
            if next(iter(base.glob(name)), None) is not None:
                return True
        elif (base / name).exists():
            return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_path_the_docs_name_exists(doc: Path) -> None:
    missing = sorted(name for name in named_paths(doc) if not _exists(name))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_readme_is_a_path_to_the_reference() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, "README.md: a path, not a manual (<= 300 lines)"
    unlinked = [d.name for d in DOCS[1:] if f"](docs/{d.name})" not in text]
    assert not unlinked, f"README.md links no {unlinked}"


def test_the_cli_synopsis_names_every_command() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    synopsis = next(b for b in blocks(ROOT / "docs" / "CLI.md") if b.lang == "text")
    named = set(re.findall(r"^robot-latency ([a-z]+)", synopsis.body, re.M))
    assert named == set(sub.choices), (
        f"docs/CLI.md's synopsis: missing {sorted(set(sub.choices) - named)}, "
        f"not commands {sorted(named - set(sub.choices))}")
