"""The README's "Bring your own model" commands work as written.

The commands are read from README.md itself (the section's first ``bash`` block), so the two
cannot drift. They run in order, in a fresh temporary directory, through a shell, with only the
substitutions a user makes: the path of their model and of their bag. The model is a
synthesized random-weight F16 GGUF of a small shape (2 layers, 256 wide, the planner's
tokenizer): the content is noise, the commands and the files they leave are what is checked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from robot_latency.floor.shapes import ModelShape
from robot_latency.lifetime import follow_parent
from robot_latency.models.synth import synth
from robot_latency.profiles.contract import complete_plan
from robot_latency.profiles.profile import load_planning
from robot_latency.records import read_records
from robot_latency.streams import Command, write_bag

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Bring your own model"
#: What a user replaces: the README's example paths.
MODEL_PATH = "~/models/qwen2.5-0.5b-instruct-f16.gguf"
BAG_PATH = "~/bags/operator_session"
TINY = ModelShape(id="tiny", name="Tiny", architecture="llama", n_layers=2, hidden=256,
                  n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, vocab_size=1024,
                  tied_embeddings=True, qkv_bias=False, context_length=4096)


def readme_commands(text: str) -> list[str]:
    """Return the commands of the section's first bash block: continuations joined, comments
    and blank lines left out."""
    section = text[text.index(SECTION):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, f"README.md: no bash block under {SECTION!r}"
    commands: list[str] = []
    current = ""
    for line in block.group(1).splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def test_readme_commands_are_read_from_the_section() -> None:
    commands = readme_commands(README.read_text(encoding="utf-8"))
    first = [c.split()[0] if not c.startswith("cp ") else "cp" for c in commands]
    assert first == ["robot-latency", "cp", "robot-latency", "robot-latency", "robot-latency"]
    assert all(MODEL_PATH in c for c in commands if c.split()[1] in ("models", "run", "sweep"))
    # event mode, no period: the line a user copies needs nothing more
    assert "--period-ms" not in " ".join(commands)


def test_bring_your_own_model_as_written(tmp_path: Path) -> None:
    model = synth(TINY, "F16", tmp_path / "models" / "tiny-f16.gguf", seed=0)
    bag = write_bag(tmp_path / "bags" / "operator_session", [
        Command(i * 500_000_000, text, f"c{i}")
        for i, text in enumerate(["STOP!", "can you find my phone", "go to the kitchen"])])
    work = tmp_path / "fresh"
    work.mkdir()
    env = {**os.environ, "ROBOT_LATENCY_CACHE_DIR": str(tmp_path / "cache"),
           # the venv's robot-latency and python, as an activated venv has them
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    commands = readme_commands(README.read_text(encoding="utf-8"))
    for command in commands:
        line = command.replace(MODEL_PATH, str(model)).replace(BAG_PATH, str(bag))
        done = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True,
                              text=True, timeout=900, preexec_fn=follow_parent())
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, done.stderr
    # what the steps left behind
    assert (work / "my_robot.yaml").is_file()
    for run_dir in (work / "runs" / "mine", *(work / "runs" / "ladder" / q
                                              for q in ("Q8_0", "Q4_K_M", "Q4_0"))):
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["cycles"] == 3, run_dir
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["status"] == "finished" and manifest["profile"]["name"] == "instruct-json"
        # a finished plan is kept: every cycle whose output is a complete, valid plan is the
        # model's, ended as soon as it was complete
        contract = load_planning(str(work / "my_robot.yaml")).contract
        for rec in read_records(run_dir / "cycles.jsonl"):
            if rec.raw_output and complete_plan(contract, rec.raw_output) is not None:
                assert rec.plan_source == "model" and rec.stop_reason == "complete", rec
    report = (work / "runs" / "ladder" / "report" / "report.md").read_text()
    assert report.split("\n## ")[1].startswith("On ")  # the target's answer comes first
    assert "against **Q8_0**: highest precision" in report
