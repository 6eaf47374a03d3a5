"""``predict --stream`` wall time once the untimed pass is cached, each run a new process.

    python bench/predict_stream_time.py --repeats 3 --out docs/bench/predict_stream_time.json
    python bench/predict_stream_time.py --repeats 1 --commands 2 --vocab 2000   # a smoke run

Two models, on ``steady_operator`` (60 commands) with the llama.cpp engine and the bundled
profile:

* ``planner``: the shipped planner's file (799 tokens of vocabulary);
* ``vocab151936``: a GGUF with the inflated Qwen2.5-0.5B's vocabulary (the planner's tokens
  padded with ``<unused_N>`` to 151,936, as :mod:`robot_latency.models.inflate` writes it) on a
  64-wide 2-layer llama (zero matrices): the metadata of the real inflated levels, in a file
  written in seconds. Its plans are nonsense and beside the point: only the time to answer from
  the cached pass is measured;
* the same file by ladder names (``--quants Q8_0 Q4_0``): each level built from it into the cache
  root's ``models/`` on the first run, then the ladder's check of each built level per run.

Per case: one run fills the untimed cache in a fresh cache root (``--cache-dir``, default a
temporary folder), then ``--repeats`` timed runs. Run it with ``PYTHONPATH`` at another checkout
to time that checkout's code on the same files.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchio import emit_result

from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.export import GGUFShape, export_gguf, gguf_tensor_names
from robot_latency.models.inflate import pad_vocab
from robot_latency.models.tokenizer import build_vocab
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

QWEN_VOCAB = 151_936


def write_big_vocab_gguf(path: Path, vocab_size: int = QWEN_VOCAB) -> Path:
    """Write the 64-wide llama with a ``vocab_size``-token vocabulary; return ``path``."""
    vocab = pad_vocab(build_vocab(), vocab_size)
    shape = GGUFShape(vocab_size=vocab.size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, context_length=256)
    tensors = {name: (np.ones(s, np.float32) if len(s) == 1 else np.zeros(s, np.float32))
               for name, s in gguf_tensor_names(shape).items()}
    return export_gguf(path, shape, tensors, vocab=vocab)


def predict_argv(stream: Path, model: Path, deadline_ms: float,
                 quants: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "robot_latency.cli", "predict", "--stream",
            str(stream), "--model", str(model), "--device",
            "orin-nano-8gb", "--deadline-ms", f"{deadline_ms:g}",
            *(["--quants", *quants] if quants else [])]


def timed_run(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--deadline-ms", type=float, default=400.0)
    ap.add_argument("--commands", type=int, default=None,
                    help="the first N commands of steady_operator (default: all 60)")
    ap.add_argument("--vocab", type=int, default=QWEN_VOCAB,
                    help="the big file's vocabulary size (default 151,936)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="the cache root the runs use (default: a new temporary folder)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    root = args.cache_dir or Path(tempfile.mkdtemp(prefix="predict-stream-time-"))
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ROBOT_LATENCY_CACHE_DIR": str(root)}
    stream: Path = SHIPPED_DIR / "steady_operator"
    if args.commands is not None:
        commands = read_stream(stream).commands[: args.commands]
        stream = write_jsonl(root / "steady_operator.jsonl", list(commands))
    label = f"vocab{args.vocab}"
    big = write_big_vocab_gguf(root / f"{label}.gguf", args.vocab)
    cases = {"planner": (bundled_model_path("planner"), ()), label: (big, ()),
             f"{label} --quants Q8_0 Q4_0": (big, ("Q8_0", "Q4_0"))}
    out: dict[str, dict[str, object]] = {}
    for label, (model, quants) in cases.items():
        argv = predict_argv(stream, model, args.deadline_ms, quants)
        first_s = timed_run(argv, env)
        runs_s, loads = [], []
        for _ in range(args.repeats):
            loads.append(_loadavg())
            runs_s.append(round(timed_run(argv, env), 3))
        out[label] = {"model": str(model), "model_bytes": model.stat().st_size,
                      "first_run_s": round(first_s, 3), "cached_runs_s": runs_s,
                      "cached_median_s": float(np.median(runs_s)), "loadavg_before": loads}
    return emit_result({"code": os.environ.get("PYTHONPATH", ""), "cache_dir": str(root),
                        "stream": str(stream), "models": out}, args.out)


if __name__ == "__main__":
    sys.exit(main())
