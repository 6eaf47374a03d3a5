"""Train the planner target and draft models with torch on the CPU, and export them to GGUF.

The model is :class:`robot_latency.models.torch_llama.LlamaModel`, llama.cpp's llama decoder.
The loss covers only the plan tokens (after ``<plan>``, ``<end>`` included).

Rebuild both shipped models from scratch (torch, numpy, gguf and llama-cpp-python needed)::

    python -m robot_latency.models.train --out robot_latency/data/models
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from robot_latency.digest import sha256_file
from robot_latency.models.corpus import Command, CorpusConfig, generate_corpus, grammar_words
from robot_latency.models.export import GGUFShape, export_gguf
from robot_latency.models.grow import grown_model
from robot_latency.models.ood import prefix_refusals
from robot_latency.models.tokenizer import PlannerTokenizer, Vocab, build_vocab
from robot_latency.models.torch_llama import LlamaModel
from robot_latency.profiles.actions import REFUSE_TOKEN

__all__ = ["DRAFT_SHAPE", "TARGET_SHAPE", "Example", "TrainConfig", "build_examples",
           "greedy_decode", "main", "train_model"]

logger = logging.getLogger(__name__)

# 8 query heads of 32 (not 4 of 64): measured here, the narrower heads learn the clause alignment
# of multi-step commands much faster at the same parameter count.
TARGET_SHAPE = dict(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=688)
DRAFT_SHAPE = dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=344)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings for one model.

    Attributes:
        steps: optimizer steps.
        batch_size: sequences per step.
        lr: peak learning rate (linear warm-up, cosine decay to 10%).
        warmup: warm-up steps.
        weight_decay: AdamW weight decay on matrices.
        seed: torch and data-order seed.
        threads: torch CPU threads.
    """

    steps: int = 3000
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.05
    seed: int = 0
    threads: int = 2


@dataclass(frozen=True)
class Example:
    """One tokenized training row.

    Attributes:
        prompt: ``[<s>, words..., <plan>]`` ids (from llama.cpp's tokenizer).
        plan: action-token ids, ``<end>`` last.
    """

    prompt: tuple[int, ...]
    plan: tuple[int, ...]


# Data


def build_examples(commands: Sequence[Command], tok: PlannerTokenizer) -> list[Example]:
    """Tokenize commands with llama.cpp's tokenizer and their plans with the vocabulary.

    Args:
        commands: corpus rows.
        tok: the planner tokenizer.

    Returns:
        One example per command.
    """
    vocab = tok.vocab
    return [
        Example(tuple(tok.encode_prompt(c.text)), tuple(vocab.id(t) for t in c.plan_tokens))
        for c in commands
    ]


def _batch(examples: Sequence[Example], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad (prompt + plan) into inputs and targets; only plan positions have a target."""
    seqs = [list(e.prompt) + list(e.plan) for e in examples]
    t = max(len(s) for s in seqs) - 1
    x = torch.full((len(seqs), t), pad, dtype=torch.long)
    y = torch.full((len(seqs), t), -100, dtype=torch.long)
    for i, (s, e) in enumerate(zip(seqs, examples, strict=True)):
        x[i, : len(s) - 1] = torch.tensor(s[:-1])
        p = len(e.prompt)
        y[i, p - 1 : len(s) - 1] = torch.tensor(s[p:])
    return x, y


def _bucketed_batches(
    examples: Sequence[Example], batch_size: int, rng: random.Random
) -> list[list[int]]:
    """Return one epoch of batches, each of similar lengths (less padding), in random order."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    window = batch_size * 32
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(
            order[start : start + window],
            key=lambda i: len(examples[i].prompt) + len(examples[i].plan),
        )
        batches.extend(chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


# Training and evaluation


@dataclass
class TrainResult:
    """What one training run produced.

    Attributes:
        model: the trained model (eval mode).
        losses: mean loss per logging interval.
        wall_s: training wall time in seconds.
    """

    model: LlamaModel
    losses: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def train_model(shape: GGUFShape, examples: Sequence[Example], cfg: TrainConfig,
                init: LlamaModel | None = None) -> TrainResult:
    """Train one model from scratch (or on from ``init``'s weights, of the same shape).

    Args:
        shape: hyper-parameters.
        examples: training rows.
        cfg: optimisation settings.
        init: start from this model instead of random weights.

    Returns:
        The trained model and its loss curve.
    """
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model = LlamaModel(shape) if init is None else init
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0}], lr=cfg.lr, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    batches: list[list[int]] = []
    res = TrainResult(model=model)
    t0 = time.perf_counter()
    running: list[float] = []
    model.train()
    for step in range(cfg.steps):
        if not batches:
            batches = _bucketed_batches(examples, cfg.batch_size, rng)
        x, y = _batch([examples[i] for i in batches.pop()], pad=0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        if (step + 1) % 50 == 0 or step + 1 == cfg.steps:
            res.losses.append(sum(running) / len(running))
            logger.info("step %d/%d loss %.4f (%.0f s)", step + 1, cfg.steps, res.losses[-1],
                        time.perf_counter() - t0)
            running = []
    res.wall_s = time.perf_counter() - t0
    model.eval()
    return res


@torch.no_grad()
def greedy_decode(
    model: LlamaModel, prompts: Sequence[Sequence[int]], *, eos: int, max_new: int = 32
) -> list[list[int]]:
    """Decode greedily over the whole vocabulary (no KV cache; prompts batched by length).

    Args:
        model: the model.
        prompts: prompt ids.
        eos: stop token id.
        max_new: most tokens to emit per prompt.

    Returns:
        The emitted ids per prompt, ``eos`` included when it came.
    """
    model.eval()
    outs: list[list[int]] = [[] for _ in prompts]
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for idxs in by_len.values():
        for start in range(0, len(idxs), 256):
            chunk = idxs[start : start + 256]
            x = torch.tensor([list(prompts[i]) for i in chunk], dtype=torch.long)
            done = torch.zeros(len(chunk), dtype=torch.bool)
            for _ in range(max_new):
                nxt = model(x)[:, -1].argmax(-1)
                for j, i in enumerate(chunk):
                    if not done[j]:
                        outs[i].append(int(nxt[j]))
                done |= nxt == eos
                if bool(done.all()) or x.shape[1] >= model.shape.context_length:
                    break
                x = torch.cat([x, nxt[:, None]], dim=1)
    return outs


@torch.no_grad()
def teacher_forced_agreement(
    draft: LlamaModel, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> float:
    """Return the fraction of output positions where the draft's argmax equals ``outputs``.

    Args:
        draft: the draft model.
        prompts: prompt ids.
        outputs: the target's greedy outputs for those prompts.

    Returns:
        The per-token greedy acceptance rate.
    """
    agree = total = 0
    for p, o in zip(prompts, outputs, strict=True):
        if not o:
            continue
        seq = torch.tensor([list(p) + list(o)[:-1]], dtype=torch.long)
        pred = draft(seq)[0, len(p) - 1 :].argmax(-1)
        agree += int((pred == torch.tensor(list(o))).sum())
        total += len(o)
    return agree / total if total else float("nan")


def exact_match_rate(outputs: Sequence[Sequence[int]], examples: Sequence[Example]) -> float:
    """Return the fraction of outputs equal to the reference plans."""
    hits = sum(list(o) == list(e.plan) for o, e in zip(outputs, examples, strict=True))
    return hits / len(examples) if examples else float("nan")


# The build


@dataclass(frozen=True)
class BuildConfig:
    """Everything that determines the shipped models.

    Attributes:
        corpus: corpus settings.
        target: target hyper-parameters (without vocab size).
        draft: draft hyper-parameters (without vocab size).
        target_train: target optimisation.
        draft_train: draft optimisation.
        dtype: GGUF tensor type.
        context_length: trained context (positions).
    """

    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    target: dict[str, int] = field(default_factory=lambda: dict(TARGET_SHAPE))
    draft: dict[str, int] = field(default_factory=lambda: dict(DRAFT_SHAPE))
    target_train: TrainConfig = field(default_factory=TrainConfig)
    draft_train: TrainConfig = field(
        default_factory=lambda: TrainConfig(steps=2000, lr=3e-3, seed=1)
    )
    dtype: str = "F32"
    context_length: int = 128
    init_from: Path | None = None  # a built model directory (its vocabulary the same or smaller)
    refuse_prefixes: int = 0  # refusals whose unknown word is a grammar word's prefix (ood.py)


def build(out: Path, cfg: BuildConfig, *, n_eval: int | None = None) -> dict[str, Any]:
    """Train target and draft from scratch, export both to GGUF and write the manifest.

    Args:
        out: output directory (``planner.gguf``, ``planner-draft.gguf``, ``manifest.json``).
        cfg: the build settings.
        n_eval: evaluate on this many held-out commands (all by default).

    Returns:
        The manifest.
    """
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    corpus = generate_corpus(cfg.corpus)
    vocab: Vocab = build_vocab()
    with PlannerTokenizer(vocab) as tok:
        tok.check_words()
        train_ex = build_examples(corpus.train + corpus.refuse_train + prefix_refusals(
            corpus.refuse_train, cfg.refuse_prefixes, grammar_words=frozenset(grammar_words()),
            seed=cfg.corpus.seed, exclude=frozenset(c.text for c in corpus.heldout
                                                    + corpus.refuse_heldout), make=Command), tok)
        held = corpus.heldout[:n_eval] if n_eval else corpus.heldout
        held_ex = build_examples(held, tok)
        refuse_ex = build_examples(corpus.refuse_heldout, tok)  # out of domain: <refuse>
    max_len = max(len(e.prompt) + len(e.plan) for e in train_ex + held_ex + refuse_ex)
    if max_len > cfg.context_length:
        raise ValueError(f"longest example {max_len} exceeds context {cfg.context_length}")
    logger.info("corpus: %d train, %d held-out; vocab %d", len(train_ex), len(held_ex), vocab.size)

    shapes = {
        role: GGUFShape(vocab_size=vocab.size, context_length=cfg.context_length, **dims)
        for role, dims in (("target", cfg.target), ("draft", cfg.draft))
    }
    trains = {"target": cfg.target_train, "draft": cfg.draft_train}
    files = {"target": "planner.gguf", "draft": "planner-draft.gguf"}
    prompts = [e.prompt for e in held_ex]
    results: dict[str, TrainResult] = {}
    models_meta: dict[str, Any] = {}
    outputs: dict[str, list[list[int]]] = {}
    for role in ("target", "draft"):
        logger.info("training %s %s", role, shapes[role])
        init = None if cfg.init_from is None else grown_model(cfg.init_from / files[role], vocab)
        res = train_model(shapes[role], train_ex, trains[role], init)
        results[role] = res
        outputs[role] = greedy_decode(res.model, prompts, eos=vocab.eos_id)
        acc = exact_match_rate(outputs[role], held_ex)
        refuse_out = greedy_decode(res.model, [e.prompt for e in refuse_ex], eos=vocab.eos_id)
        refused = [vocab.id(REFUSE_TOKEN), vocab.eos_id]
        logger.info("%s held-out exact match %.4f (%.0f s)", role, acc, res.wall_s)
        path = export_gguf(
            out / files[role],
            shapes[role],
            res.model.gguf_tensors(),
            name=f"robot_latency planner {role}",
            dtype=cfg.dtype,
            vocab=vocab,
        )
        models_meta[role] = {
            "file": files[role],
            "sha256": sha256_file(path),
            "size_bytes": path.stat().st_size,
            "dtype": cfg.dtype,
            "shape": asdict(shapes[role]),
            "n_params": res.model.n_params(),
            "train": asdict(trains[role]),
            "train_wall_s": round(res.wall_s, 1),
            "final_loss": round(res.losses[-1], 5),
            "heldout_exact_match": round(acc, 4),
            # held-out out-of-domain commands refused; held-out in-domain ones refused
            "heldout_refuse_rate": round(exact_match_rate(refuse_out, refuse_ex), 4),
            "heldout_in_domain_refused": round(
                sum(o == refused for o in outputs[role]) / max(1, len(held_ex)), 4),
        }
    acceptance = teacher_forced_agreement(results["draft"].model, prompts, outputs["target"])
    wall = time.perf_counter() - t_start
    manifest = {
        "format": 1,
        "description": "robot_latency demo planner (target) and its draft; llama GGUF.",
        "prompt": {
            "text": "normalize_command(command) + '<plan>'",
            "tokenize": {"add_bos": True, "special": True},
            "stop_token": "<end>",
        },
        "models": models_meta,
        "draft_acceptance_rate": round(acceptance, 4),
        "corpus": {
            **asdict(cfg.corpus),
            "train_commands": len(train_ex),  # refusals included
            "refuse_prefixes": cfg.refuse_prefixes,
            "heldout_commands": len(held_ex),
            "vocab_size": vocab.size,
        },
        "build_wall_s": round(wall, 1),
        "build_command": "python -m robot_latency.models.train --out robot_latency/data/models"
        + (f" --init-from {cfg.init_from} --target-steps {cfg.target_train.steps} --draft-steps "
           f"{cfg.draft_train.steps} --lr {cfg.target_train.lr}" if cfg.init_from else "")
        + (f" --refuse-prefixes {cfg.refuse_prefixes}" if cfg.refuse_prefixes else ""),
        "torch_version": torch.__version__,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    logger.info("acceptance %.4f; build %.0f s", acceptance, wall)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """Run the build from the command line.

    Args:
        argv: arguments (``--out DIR`` and optional overrides).

    Returns:
        The exit status.
    """
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--draft-steps", type=int, default=None)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--n-eval", type=int, default=None, help="held-out commands to evaluate")
    ap.add_argument("--dtype", choices=("F32", "F16"), default="F32")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from this directory's models (a vocabulary that only grew)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate of both models")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default 2)")
    ap.add_argument("--refuse-prefixes", type=int, default=0,
                    help="add this many refusals whose unknown word is a grammar word's prefix")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = BuildConfig(dtype=args.dtype, init_from=args.init_from,
                      refuse_prefixes=args.refuse_prefixes)
    for role, steps in (("target_train", args.target_steps), ("draft_train", args.draft_steps)):
        over = {**({"lr": args.lr, "warmup": 20} if args.lr is not None else {}),
                **({"threads": args.threads} if args.threads is not None else {}),
                **({"steps": steps} if steps is not None else {})}
        cfg = replace(cfg, **{role: replace(getattr(cfg, role), **over)})
    if args.n_train is not None:
        cfg = replace(cfg, corpus=replace(cfg.corpus, n_train=args.n_train))
    build(args.out, cfg, n_eval=args.n_eval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
