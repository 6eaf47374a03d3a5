"""Every ladder level loads and decodes with the project's own settings, each in a fresh process.

A level that crashes llama.cpp (the AMX path's segfault in decode, an illegal instruction from a
wheel built for another CPU) kills the process it runs in: here that is a child of the test, so
the test fails with the level and the signal instead of ending the whole run. The model is a
random-weight llama with rows of 256 and 512, so the K-quant levels get their real types (not
llama.cpp's fallbacks), and Q4_0 and Q8_0 the REPACK layouts where this CPU uses them.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from robot_latency.models import ladder

#: The child: settings resolved as a run resolves them, the engine built as the planner builds
#: it, one generation under the profile's grammar with no deadline.
CHILD = """
import json, sys, tempfile
from robot_latency.engines import GenerationRequest
from robot_latency.planner.config import RunSettings
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.resolve import resolve_run

run, _ = resolve_run(RunSettings(engine="llamacpp", model=sys.argv[1],
                                 log_dir=tempfile.mkdtemp()))
engine = create_planner_engine("llamacpp", **run.engine_options)
prompt = run.planning.build("pick up the red cup")
trace = engine.generate(GenerationRequest(
    prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=run.planning.max_tokens,
    grammar=run.planning.contract.grammar, complete=run.planning.contract.kind))
info = engine.info()
engine.close()
print(json.dumps({"tokens": len(trace.token_ns), "stop": trace.stop_reason.value,
                  "error": trace.error, "quant": info["quant"],
                  "load_policy": info["load_policy"]}))
"""


@pytest.fixture(scope="module")
def levels(tmp_path_factory, random_llama_gguf) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("levels")
    write = functools.partial(random_llama_gguf, dim=256, ffn_dim=512, n_heads=4, n_kv_heads=2,
                              n_layers=2, matrix_std=None, context_length=512)
    man = ladder.build_ladder(write(d / "tiny.gguf"), d / "cache", quants=ladder.LADDER,
                              nthread=2)
    return {quant: man.cache_dir / level.file for quant, level in man.levels.items()}


@pytest.mark.parametrize("quant", ladder.LADDER)
def test_level_loads_and_decodes_in_a_fresh_process(levels: dict[str, Path], quant: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, str(levels[quant])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"{quant}: the child ended with {done.returncode} (a negative code is the signal that "
        f"killed it): {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["error"] is None and out["tokens"] >= 1, out
    assert out["stop"] in ("done", "complete", "max_tokens"), out
    assert out["load_policy"]["extra_bufts"] == "auto"
