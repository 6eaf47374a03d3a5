"""Every subcommand's bad input ends in one line naming it and exit status 2, never a traceback.

The table must name every leaf command of the parser (a new command without a row fails here).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from robot_latency.cli import build_parser, main
from robot_latency.streams import SHIPPED_DIR

#: Commands that take no input a user could get wrong (only flags such as --json), and probe,
#: whose one input is a cache: one it cannot read or write is a logged warning, and the fresh
#: measurement is used (floor/probe.py, load_or_probe_host).
NO_INPUT = {"devices", "profiles", "probe"}


def bad_argv(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """command -> (argv with a bad value, text the error must contain)."""
    nope = str(tmp_path / "nope")
    full, corrupt = tmp_path / "full", tmp_path / "corrupt.json"
    return {
        "detect": (["detect", "--root", str(corrupt)], "corrupt.json: not a directory"),
        "model": (["model", nope + ".gguf"], "nope.gguf"),
        "floor": (["floor", "--device", "orin-xyz", "--model", "qwen2.5-0.5b", "--json"],
                  "orin-xyz"),
        "specdec": (["specdec", "--alpha", "1.5", "-k", "3", "-c", "0.1"], "alpha"),
        "predict": (["predict", "--device", "orin-nano-8gb", "--model", "qwen2.5-0.5b",
                     "--quant", "Q4_K_M", "--engine-family", "warp", "--json"], "warp"),
        "calibrate": (["calibrate", nope + "-run"], "nope-run"),
        "run": (["run", "--stream", nope + ".jsonl", "--out", str(tmp_path / "r")],
                "nope.jsonl"),
        "run --quant": (["run", "--stream", nope + ".jsonl", "--quant", "Q4_K", "--engine",
                         "sim", "--out", str(tmp_path / "r")], "--quant: unknown level 'Q4_K'"),
        "sweep --frame-scales": (["sweep", "--stream", str(SHIPPED_DIR / "steady_operator"),
                                  "--frame-scales", "1,0.5", "--out", str(tmp_path / "s")],
                                 "--frame-scales: only with --mmproj FILE"),
        "sweep --deadlines": (["sweep", "--stream", str(SHIPPED_DIR / "steady_operator"),
                               "--deadlines", "100,fast", "--out", str(tmp_path / "s")],
                              "--deadlines: 'fast' is not a number"),
        "run --mmproj": (["run", "--stream", str(SHIPPED_DIR / "steady_operator"), "--mmproj",
                          nope + ".gguf", "--out", str(tmp_path / "r")],
                         "--mmproj: " + nope + ".gguf: no such file"),
        "run --mmproj sim": (["run", "--stream", str(SHIPPED_DIR / "steady_operator"),
                              "--engine", "sim", "--mmproj", nope + ".gguf", "--out",
                              str(tmp_path / "r")],
                             "--mmproj: only the llamacpp engine takes a vision tower"),
        "run --vision-encoder": (["run", "--stream", str(SHIPPED_DIR / "steady_operator"),
                                  "--vision-encoder", "onnx", "--out", str(tmp_path / "r")],
                                 "--vision-encoder: 'onnx': only with mmproj"),
        "predict --quant": (["predict", "--model", "qwen2.5-0.5b", "--quant", "Q4_K"],
                            "--quant: unknown level 'Q4_K'"),
        "predict --mmproj": (["predict", "--mmproj", nope + ".gguf"],
                             "--mmproj " + nope + ".gguf: no such file"),
        "predict --vision-tower": (["predict", "--vision-tower", "vit-xyz"],
                                   "--vision-tower: tower='vit-xyz'"),
        "predict --image-px": (["predict", "--vision-tower", "clip-l14-336", "--image-px",
                                "300"], "--image-px 300: clip-l14-336: image_size_px=300"),
        "predict --image-px alone": (["predict", "--image-px", "336"],
                                     "--image-px: give --mmproj FILE or --vision-tower SHAPE"),
        "predict --frame-px": (["predict", "--vision-tower", "clip-l14-336", "--frame-px",
                                "640x0"], "--frame-px"),
        "predict --image-policy": (["predict", "--stream", nope + ".jsonl", "--vision-tower",
                                    "clip-l14-336", "--image-policy", "sometimes"],
                                   "--image-policy"),
        "predict --fit-scales": (["predict", "--stream", nope + ".jsonl", "--vision-tower",
                                  "siglip-b16-512", "--image-policy", "fit", "--fit-scales",
                                  "1", "2"], "--fit-scales: each in (0, 1], got 2.0"),
        "predict --fit-scales without fit": (["predict", "--stream", nope + ".jsonl",
                                              "--vision-tower", "siglip-b16-512",
                                              "--fit-scales", "0.5"],
                                             "--fit-scales: only with --image-policy fit"),
        "predict --image-policy alone": (["predict", "--stream", nope + ".jsonl",
                                          "--image-policy", "reuse"],
                                         "--image-policy: give --mmproj FILE or --vision-tower"),
        "predict --image-policy no stream": (["predict", "--vision-tower", "clip-l14-336",
                                              "--image-policy", "reuse"],
                                             "--image-policy: only with --stream FILE"),
        "predict --max-frame-age-ms": (["predict", "--stream", nope + ".jsonl",
                                        "--vision-tower", "clip-l14-336",
                                        "--max-frame-age-ms", "-5"],
                                       "--max-frame-age-ms: must be > 0"),
        "sweep --quants": (["sweep", "--stream", nope + ".jsonl", "--quants", "Q8_0,Q5_K",
                            "--out", str(tmp_path / "s")], "--quants: unknown level 'Q5_K'"),
        "floor --quant": (["floor", "--model", "qwen2.5-0.5b", "--quant", "q4_k"],
                          "--quant: unknown level 'q4_k'"),
        "sweep": (["sweep", "--stream", nope + ".jsonl", "--out", str(tmp_path / "s")],
                  "nope.jsonl"),
        "report": (["report", nope + "-run"], "nope-run"),
        "summarize": (["summarize", nope + ".jsonl"], "nope.jsonl"),
        "models build": (["models", "build", "--quants", "Q9_X", "--inflate", "",
                          "--cache-dir", str(tmp_path / "cache")], "Q9_X"),
        "models build --planner": (["models", "build", "--planner", "json", "--accuracy", "5",
                                    "--inflate", "", "--cache-dir", str(tmp_path / "cache")],
                                   "--accuracy"),
        "models ladder": (["models", "ladder", nope + ".gguf"], "nope.gguf"),
        "models synth": (["models", "synth", "--shape", "nope"], "nope"),
        "models onnx": (["models", "onnx", "--model", nope + ".gguf",
                         "--cache-dir", str(tmp_path / "cache")], "nope.gguf"),
        "streams make": (["streams", "make", "--out", str(tmp_path / "bag")], "--process"),
        "models mmproj": (["models", "mmproj", "--tower", "vit-h", "--out",
                                   str(tmp_path / "t.gguf")], "--tower: tower='vit-h'"),
        "models mmproj --image-px": (["models", "mmproj", "--tower", "clip-l14-336",
                                      "--image-px", "300", "--out", str(tmp_path / "t.gguf")],
                                     "--image-px 300: clip-l14-336: image_size_px=300"),
        "models mmproj --model": (["models", "mmproj", "--model", nope + ".gguf"],
                                  "--model " + nope + ".gguf: no such file"),
        "demo": (["demo", "--out", str(full), "--quants", "Q8_0,Q4_K"], "Q4_K"),
        "demo --max-pause-s": (["demo", "--out", str(full), "--max-pause-s", "-1"],
                               "--max-pause-s: must be >= 0, got -1"),
        "envelope": (["envelope", "--stream", nope + ".jsonl", "--model", "qwen2.5-0.5b",
                      "--from-labels", "--device", "orin-nano-8gb"], "nope.jsonl"),
        "doctor": (["doctor", "--params-file", nope + ".yaml"], "nope.yaml"),
        "launch": (["launch", "planner", "--params-file", nope + ".yaml"], "nope.yaml"),
        "fleet": (["fleet", "--server-url", "http://127.0.0.1:1/v1", "--robots", "1,x",
                   "--stream", nope + ".jsonl", "--out", str(tmp_path / "f")], "--robots"),
        "fleet --find-robots": (["fleet", "--server-url", "http://127.0.0.1:1/v1",
                                 "--find-robots", "--robots", "1,2", "--stream", nope + ".jsonl",
                                 "--out", str(tmp_path / "f")],
                                "--robots '1,2': --find-robots chooses the fleet sizes"),
        "fleet --miss-target": (["fleet", "--server-url", "http://127.0.0.1:1/v1",
                                 "--find-robots", "--miss-target", "1.5", "--stream",
                                 nope + ".jsonl", "--out", str(tmp_path / "f")],
                                "--miss-target: must be in [0, 1), got 1.5"),
        "fleet --find-robots-trials": (["fleet", "--server-url", "http://127.0.0.1:1/v1",
                                        "--find-robots", "--find-robots-trials", "0",
                                        "--stream", nope + ".jsonl", "--out",
                                        str(tmp_path / "f")],
                                       "--find-robots-trials: must be >= 1, got 0"),
        "run --find-rate": (["run", "--find-rate", "--miss-target", "-0.1", "--stream",
                             nope + ".jsonl", "--out", str(tmp_path / "r")],
                            "--miss-target: must be in [0, 1), got -0.1"),
    }


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
                  ) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from leaf_commands(sub, (*prefix, name))
            return
    yield " ".join(prefix)


def test_the_table_covers_every_command(tmp_path: Path) -> None:
    # Rows "command --flag" are a further bad value of a command already covered.
    commands = {c for c in bad_argv(tmp_path) if "--" not in c}
    assert set(leaf_commands(build_parser())) == commands | NO_INPUT


def _files(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "corrupt.json").write_text("{not json")


@pytest.mark.parametrize("command", sorted(bad_argv(Path("/x"))))
def test_bad_input_is_one_line_and_exit_2(command: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    _files(tmp_path)
    argv, needle = bad_argv(tmp_path)[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"robot-latency {argv[0]}: error: ") and needle in lines[0], err
    assert (tmp_path / "full" / "x").exists()  # a refused command leaves a previous run alone


def test_quant_levels_are_checked_alike_by_every_command(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    # predict once took Q4_K (a ggml type) silently and answered differently from Q4_K_M,
    # while sweep refused Q5_K: now every command refuses both, with the same message.
    messages = set()
    for argv in (["predict", "--quant", "Q4_K"], ["floor", "--quant", "Q4_K"],
                 ["run", "--stream", "s.jsonl", "--out", str(tmp_path / "r"), "--quant", "Q4_K"],
                 ["sweep", "--stream", "s.jsonl", "--out", str(tmp_path / "s"),
                  "--quants", "Q4_K"],
                 ["doctor", "--quant", "Q4_K"], ["models", "ladder", "x.gguf", "--quants", "Q4_K"]):
        assert main(argv) == 2
        message = capsys.readouterr().err.split(": error: ", 1)[1]
        messages.add(message.replace("--quants", "--quant"))
    assert len(messages) == 1, messages
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()
    # and a level in any case is the same level everywhere
    assert main(["predict", "--quant", "q4_k_m", "--json"]) == 0
    lower = capsys.readouterr().out
    assert main(["predict", "--quant", "Q4_K_M", "--json"]) == 0
    assert capsys.readouterr().out == lower


def test_a_misspelled_flag_prints_the_subcommands_usage(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--stream", "s.jsonl", "--out", "o", "--dedline-ms", "80"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: robot-latency run ") and "--deadline-ms" in err
    assert "robot-latency run: error: unrecognized arguments: --dedline-ms 80" in err
    with pytest.raises(SystemExit):
        main(["models", "synth", "--shape", "qwen2.5-0.5b", "--sed", "1"])
    err = capsys.readouterr().err
    assert err.startswith("usage: robot-latency models synth ")
    assert "unrecognized arguments: --sed 1" in err
    with pytest.raises(SystemExit):  # the top level's own misspelled flag: its usage
        main(["--colour", "run", "--stream", "s.jsonl", "--out", "o"])
    err = capsys.readouterr().err
    assert err.startswith("usage: robot-latency [-h]") and "--colour" in err


def test_a_failed_start_leaves_no_run_directory(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    stream = tmp_path / "s.jsonl"
    stream.write_text('{"t_ns": 0, "text": "stop"}\n')
    fake = tmp_path / "notes.gguf"
    fake.write_text("not a model")
    out = tmp_path / "runs" / "mine"
    assert main(["run", "--stream", str(stream), "--model", str(fake), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "notes.gguf: not a GGUF file" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nor the parent it would have created
    sweep = tmp_path / "sweeps" / "mine"
    assert main(["sweep", "--stream", str(stream), "--model", str(fake), "--devices",
                 "orin-nano-8gb,orin-agx-64gb", "--out", str(sweep)]) == 2
    assert "notes.gguf: not a GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()
    # a directory that was there before is the user's: it stays, as it was
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    assert main(["run", "--stream", str(stream), "--model", str(fake), "--out", str(out)]) == 2
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
