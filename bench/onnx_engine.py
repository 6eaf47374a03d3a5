"""Benchmark of the ONNX Runtime engine: ITL with and without IO binding, FP32 against INT8.

The four variants (fp32/int8 x io_binding on/off) run interleaved, round-robin, so drift in the
machine's state hits them alike. Prints one JSON object (per-variant ITL and TTFT percentiles with
sample counts, and the ratios measured side by side); --out writes it too.

    python bench/onnx_engine.py --gguf M.gguf [--runs 20 --tokens 32 --threads 1]
    python bench/onnx_engine.py --random-dim 512 --random-layers 8   # timing only: noise output

Without --gguf a random-weight llama with the planner vocabulary is written first (its outputs
are noise: use it for timing only). The ONNX files are exported next to the GGUF's copy in
--work-dir (a temporary directory by default).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from benchio import emit_result

import robot_latency.engines.onnx  # noqa: F401  (registers "onnx")
from robot_latency.engines import create_engine
from robot_latency.engines.base import GenerationRequest
from robot_latency.models.export import GGUFShape, export_gguf, gguf_tensor_names
from robot_latency.models.onnx_export import export_all
from robot_latency.models.tokenizer import build_vocab, format_prompt

CMD = "pick up the red cup and put it on the tray"


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, np.float64), q)) if values else None


def random_gguf(path: Path, *, dim: int, layers: int, seed: int = 0) -> Path:
    """Write a random-weight llama (head_dim 64, 2 KV-head groups) with the planner vocabulary."""
    vocab = build_vocab()
    heads = max(1, dim // 64)
    shape = GGUFShape(vocab_size=vocab.size, dim=dim, n_layers=layers, n_heads=heads,
                      n_kv_heads=max(1, heads // 2) if heads % 2 == 0 else heads,
                      ffn_dim=4 * dim, context_length=1024)
    rng = np.random.default_rng(seed)
    tensors = {name: (rng.standard_normal(s) * 0.05 if len(s) > 1 else np.ones(s)
                      ).astype(np.float32) for name, s in gguf_tensor_names(shape).items()}
    return export_gguf(path, shape, tensors, vocab=vocab)


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="onnx-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.gguf:
        gguf = work / Path(args.gguf).name
        if gguf.resolve() != Path(args.gguf).resolve():
            shutil.copyfile(args.gguf, gguf)  # the engine finds the tokenizer by stem
        source = str(args.gguf)
    else:
        gguf = random_gguf(work / "random.gguf", dim=args.random_dim, layers=args.random_layers)
        source = f"random dim={args.random_dim} layers={args.random_layers} (timing only)"
    manifest = export_all(gguf, work)
    models = {"fp32": work / manifest["files"]["fp32"]["path"],
              "int8": work / manifest["files"]["int8"]["path"]}
    variants = {f"{w}_{'iobind' if b else 'plain'}": (w, b)
                for w in ("fp32", "int8") for b in (True, False)}
    engines = {name: create_engine("onnx", model_path=str(models[w]), io_binding=b,
                                   providers=tuple(args.providers.split(",")),
                                   intra_op_threads=args.threads, n_ctx=args.n_ctx)
               for name, (w, b) in variants.items()}
    request = GenerationRequest(prompt=format_prompt(CMD), max_tokens=args.tokens)
    itl: dict[str, list[float]] = {n: [] for n in variants}
    ttft: dict[str, list[float]] = {n: [] for n in variants}
    for engine in engines.values():  # warm-up: first-run allocations, prefix cache
        engine.generate(request)
    for _ in range(args.runs):
        for name, engine in engines.items():
            trace = engine.generate(request)
            if trace.error is not None:
                raise RuntimeError(f"{name}: {trace.error}")
            ttft[name].append((trace.token_ns[0] - trace.started_ns) / 1e6)
            itl[name] += (np.diff(np.asarray(trace.token_ns, np.int64)) / 1e6).tolist()
    out: dict[str, Any] = {"source": source, "runs": args.runs, "tokens": args.tokens,
                           "threads": args.threads,
                           "note": "same prompt every run: TTFT is with the prefix cache "
                                   "(one token of prefill)",
                           "variants": {}}
    for name, engine in engines.items():
        info = engine.info()
        out["variants"][name] = {
            "itl_p50_ms": _pct(itl[name], 50), "itl_p90_ms": _pct(itl[name], 90),
            "itl_n": len(itl[name]), "ttft_p50_ms": _pct(ttft[name], 50),
            "ttft_n": len(ttft[name]), "provider": info["provider"],
            "model_bytes": info["model_bytes"], "weights": info["weights"],
            "io_binding": info["io_binding"]}
        engine.close()
    v = out["variants"]

    def ratio(a: str, b: str) -> float | None:
        x, y = v[a]["itl_p50_ms"], v[b]["itl_p50_ms"]
        return None if x is None or y is None or y == 0 else x / y

    out["itl_p50_ratio"] = {
        "fp32_iobind_over_plain": ratio("fp32_iobind", "fp32_plain"),
        "int8_iobind_over_plain": ratio("int8_iobind", "int8_plain"),
        "int8_over_fp32_iobind": ratio("int8_iobind", "fp32_iobind"),
        "int8_over_fp32_plain": ratio("int8_plain", "fp32_plain")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default="", help="source GGUF (default: a random-weight model)")
    ap.add_argument("--random-dim", type=int, default=512)
    ap.add_argument("--random-layers", type=int, default=8)
    ap.add_argument("--work-dir", default="")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--providers", default="CPUExecutionProvider",
                    help="comma-separated, in order of preference")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return emit_result(run(args), Path(args.out) if args.out else None)


if __name__ == "__main__":
    sys.exit(main())
