"""``predict --stream`` without weights (a model preset, or ``--from-labels``), its first line
when a pass found no valid plan or cut outputs, the token budget, and the CLI's small rules:
no abbreviated flag, one ``--quants`` syntax, ``--skip-bad-lines``."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from robot_latency.cli import build_parser, main
from robot_latency.cli.common import check_quant_flags
from robot_latency.models.bundled import bundled_model_path
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))


def _labelled(tmp_path: Path, n: int = 12) -> Path:
    """A JSONL copy of a shipped stream's first commands, its labels.jsonl beside it."""
    full = read_stream(SHIPPED_DIR / "steady_operator")
    path = write_jsonl(tmp_path / "s.jsonl", list(full.commands[:n]))
    shutil.copy(SHIPPED_DIR / "steady_operator" / "labels.jsonl", tmp_path / "labels.jsonl")
    return path


def test_a_preset_is_answered_from_its_labels(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    stream = _labelled(tmp_path)
    assert main(["predict", "--stream", str(stream), "--model", "qwen2.5-0.5b", "--quants",
                 "Q4_K_M,Q8_0", "--deadline-ms", "1500", "--draws", "50"]) == 0
    out = capsys.readouterr().out
    # 3 of the 12 labelled plans have more steps than the JSON schema allows: said first
    first, second = out.splitlines()[:2]
    assert first.startswith("WARNING: Q4_K_M: the labelled plans had no valid plan for 3 of 12 "
                            "commands; Q8_0: ")
    assert "max_tokens" not in first
    assert "from the labelled plans (no weights)" in second
    assert ("The answer assumes the model writes each command's labelled plan (no weights, no "
            "untimed pass): compact JSON, no spaces (the grammar's) (profile instruct-json), "
            "tokenized by ggml-vocab-qwen2.gguf") in out
    assert "| Q4_K_M | 12 |" in out and "| Q8_0 | 12 |" in out
    assert "Token budget on the target" in out and "the plans take" in out
    assert not list((tmp_path / "cache").glob("untimed/*.json"))  # no untimed pass ran
    assert main(["predict", "--stream", str(stream), "--model", "qwen2.5-0.5b", "--profile",
                 "bundled-actions", "--deadline-ms", "1500", "--draws", "50", "--json"]) == 0
    level, = json.loads(capsys.readouterr().out)["levels"]
    assert "compact action tokens (profile bundled-actions)" in level["facts"]["assumption"]
    p50, p95 = level["facts"]["tokens_per_plan"]
    b50, b95 = level["facts"]["budget_tokens"]
    assert 0 < p50 <= p95 and b50 >= b95 > 0


def test_the_first_line_says_outputs_were_cut(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    stream = _labelled(tmp_path, 6)
    assert main(["predict", "--stream", str(stream), "--model", str(bundled_model_path()),
                 "--from-labels", "--max-tokens", "3", "--draws", "20"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("WARNING: planner.gguf: the labelled plans had no valid plan for ")
    assert "outputs cut at max_tokens (3)" in first
    # the untimed pass of the real model: the same line from what it found
    assert main(["predict", "--stream", str(stream), "--model", str(bundled_model_path()),
                 "--max-tokens", "2", "--draws", "20"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    found = re.match(r"WARNING: planner.gguf: the untimed pass had no valid plan for (\d) of 6 "
                     r"commands and (\d) outputs cut at max_tokens \(2\)", first)
    assert found and int(found[1]) >= int(found[2]) >= 4  # "<stop><end>" fits in 2 tokens


def test_skip_bad_lines_is_taken_where_it_is_advised(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    stream = _labelled(tmp_path, 4)
    stream.write_text(stream.read_text() + "not json\n")
    base = ["predict", "--stream", str(stream), "--model", "qwen2.5-0.5b", "--draws", "20"]
    assert main(base) == 2
    assert "--skip-bad-lines" in capsys.readouterr().err
    assert main([*base, "--skip-bad-lines"]) == 0


def test_no_flag_is_taken_by_its_abbreviation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["predict", "--deadline", "5"])
    assert info.value.code == 2
    assert "unrecognized arguments: --deadline 5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["streams", "make", "--ou", "x", "--shipped"])


def test_every_parser_refuses_abbreviations() -> None:
    """Every ArgumentParser and add_parser call in the package and the bench scripts says
    allow_abbrev=False (the CLI's own parsers are cli.common.Parser, which does)."""
    missing = []
    for path in [*ROOT.glob("robot_latency/**/*.py"), *ROOT.glob("bench/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr not in ("ArgumentParser", "add_parser"):
                continue
            if path.name in ("common.py",) or "/cli/" in path.as_posix():
                continue  # cli.common.Parser and its subcommands' parsers (same class)
            if not any(k.arg == "allow_abbrev" for k in node.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert missing == []
    # the CLI's: every subcommand's parser, however deep
    stack = [build_parser()]
    while stack:
        parser = stack.pop()
        assert parser.allow_abbrev is False, parser.prog
        for action in parser._actions:
            stack.extend(getattr(action, "choices", None).values()
                         if isinstance(getattr(action, "choices", None), dict) else ())


@pytest.mark.parametrize("argv", [
    ["predict", "--quants", "q8_0", "Q4_0"], ["predict", "--quants", "Q8_0,q4_0"],
    ["sweep", "--stream", "s", "--out", "o", "--quants", "Q8_0", "Q4_0"],
    ["sweep", "--stream", "s", "--out", "o", "--quants", "Q8_0,Q4_0"],
    ["demo", "--quants", "Q8_0", "q4_0"],
])
def test_one_quants_syntax_everywhere(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    check_quant_flags(args)
    assert args.quants == "Q8_0,Q4_0"


def test_a_shipped_model_by_name_keeps_its_own_profile(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    stream = _labelled(tmp_path, 6)
    assert main(["predict", "--stream", str(stream), "--model", "planner", "--from-labels",
                 "--draws", "20", "--json"]) == 0
    level, = json.loads(capsys.readouterr().out)["levels"]
    assert level["facts"]["assumption"].startswith(
        "assumes the model writes each command's labelled plan (no weights, no untimed pass): "
        "compact action tokens (profile bundled-actions), tokenized by planner.gguf")
    assert level["facts"]["cut_at_max_tokens"] == 0
