"""Install a trained JSON planner: ship its compact file, build the full GGUF, evaluate it with
llama.cpp under the grammar, and write its manifest.

    python -m robot_latency.models.json_train --out build/json
    python -m robot_latency.models.json_build --trained build/json --out robot_latency/data/models

A run that continued from the shipped model (``json_train --init
robot_latency/data/models/planner-json.compact.gguf``) is installed with ``--continues``: the
manifest then keeps the earlier phases of training and adds this one (steps and wall time summed,
the commands joined), so the shipped file's whole history stays on record.

The manifest (``planner-json.manifest.json``) records the files and digests (the compact file in
the package, the full-vocabulary file built from it), the shape, the training settings and wall
time, the prompt format, and the figures through llama.cpp with the grammar: held-out exact
match, held-out out-of-domain commands refused, held-out in-domain commands refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from robot_latency.digest import sha256_file
from robot_latency.models.bundled import JSON_MANIFEST
from robot_latency.models.corpus import corpus_config_from_dict, generate_corpus
from robot_latency.models.json_corpus import JSON_PROFILE, TOKENIZER_FAMILY
from robot_latency.models.json_eval import evaluate_json
from robot_latency.models.json_export import COMPACT_FILE, FULL_NAME, ensure_full

__all__ = ["install", "main"]

logger = logging.getLogger(__name__)


def _phases(previous: dict[str, Any] | None, meta: dict[str, Any], command: str
            ) -> dict[str, Any]:
    """The ``train`` record: this run alone, or the previous manifest's phases and this one."""
    this = {**meta["train"], "steps_done": meta["steps_done"], "wall_s": meta["train_wall_s"],
            "final_loss": meta["final_loss"], "torch_greedy": meta["torch_greedy"]}
    if previous is None:
        return {"train": meta["train"], "steps_done": meta["steps_done"],
                "train_wall_s": meta["train_wall_s"], "build_command": command}
    old = previous["train"]
    phases = dict(old) if all(k.startswith("phase_") for k in old) else {"phase_1": old}
    name = f"phase_{len(phases) + 1}"
    phases[name] = {**this, "init": f"phase {len(phases)}'s weights (the shipped compact file)"}
    return {"train": phases, "steps_done": previous["steps_done"] + meta["steps_done"],
            "train_wall_s": round(previous["train_wall_s"] + meta["train_wall_s"], 1),
            "build_command": f"{previous['build_command']}; {command} ({name})"}


def install(trained: Path, out: Path, cache_dir: Path, *, n_eval: int, n_refuse: int,
            train_command: str, continues: bool = False) -> dict[str, Any]:
    """Copy the compact model into ``out``, build and evaluate the full one, write the manifest.

    Args:
        trained: the training run's directory (``json_train --out``).
        out: the package's models directory.
        cache_dir: where the full-vocabulary GGUF is built.
        n_eval: held-out in-domain commands evaluated through llama.cpp (the first ones).
        n_refuse: held-out out-of-domain commands evaluated.
        train_command: the training command line, for the manifest.
        continues: the run continued from the model now in ``out``: keep that manifest's
            phases and add this one.

    Returns:
        The manifest.
    """
    meta = json.loads((trained / "train.json").read_text())
    previous = json.loads((out / JSON_MANIFEST).read_text()) if continues else None
    out.mkdir(parents=True, exist_ok=True)
    compact = out / COMPACT_FILE
    shutil.copyfile(trained / COMPACT_FILE, compact)
    t0 = time.perf_counter()
    full = ensure_full(compact, cache_dir)
    build_s = time.perf_counter() - t0
    corpus = generate_corpus(corpus_config_from_dict(meta["corpus"]))
    t0 = time.perf_counter()
    figures = evaluate_json(full, corpus.heldout[:n_eval], corpus.refuse_heldout[:n_refuse])
    eval_s = time.perf_counter() - t0
    logger.info("llama.cpp with the grammar: %s (%.0f s)", figures, eval_s)
    manifest = {
        "format": 1,
        "description": "robot_latency JSON planner: llama decoder on Qwen2's tokenizer, chatml "
                       "prompt, compact JSON plan under plan.schema.json.",
        "profile": JSON_PROFILE,
        "tokenizer_family": TOKENIZER_FAMILY,
        "prompt": {"format": "profile bundled-json (chatml; system prompt with the schema and "
                             "3 examples; the command as the user turn)",
                   "prefix_tokens": meta["corpus"]["prefix_tokens"],
                   "answer": "compact JSON (json_corpus.plan_text), then <|im_end|>"},
        "compact": {"file": COMPACT_FILE, "sha256": sha256_file(compact),
                    "size_bytes": compact.stat().st_size, "dtype": "F16 (norms F32)",
                    "mapped_ids": meta["mapped_ids"]},
        "full": {"file": f"{FULL_NAME}.F16.gguf (in the model cache)",
                 "sha256": sha256_file(full), "size_bytes": full.stat().st_size,
                 "dtype": "F16 (norms F32)", "build_s": round(build_s, 1)},
        "shape": {**meta["shape"], "vocab_size_full": int(meta.get("n_vocab", 151936))},
        "n_params_compact": meta["n_params"],
        **{k: v for k, v in _phases(previous, meta, train_command).items()
           if k != "build_command"},
        "final_loss": meta["final_loss"],
        "torch_greedy_no_grammar": meta["torch_greedy"],
        "llamacpp_grammar": {**figures, "eval_s": round(eval_s, 1)},
        "corpus": meta["corpus"],
        "build_command": _phases(previous, meta, train_command)["build_command"]
        + f"; python -m robot_latency.models.json_build --trained {trained} --out {out} "
          f"--n-eval {n_eval} --n-refuse {n_refuse}" + (" --continues" if continues else ""),
        "torch_version": meta["torch_version"],
    }
    (out / JSON_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """Run :func:`install` from the command line."""
    from robot_latency.models.ladder_manifest import default_cache_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--trained", type=Path, required=True, help="json_train's --out directory")
    ap.add_argument("--out", type=Path, required=True, help="the package's models directory")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--n-eval", type=int, default=200)
    ap.add_argument("--n-refuse", type=int, default=100)
    ap.add_argument("--train-command", default="python -m robot_latency.models.json_train "
                                                "--out build/json")
    ap.add_argument("--continues", action="store_true",
                    help="the run continued from the shipped model: add it as a phase of its "
                    "training")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    install(args.trained, args.out, args.cache_dir or default_cache_dir(), n_eval=args.n_eval,
            n_refuse=args.n_refuse, train_command=args.train_command,
            continues=args.continues)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
