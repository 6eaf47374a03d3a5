"""Train the JSON planner: a small llama decoder on Qwen2 token ids, the chat prefix shared.

The corpus is :mod:`robot_latency.models.json_corpus` (chatml prompt, compact JSON plan). The
model reads and writes a compact map of the Qwen2 ids the training rows use (:class:`TokenMap`);
every other id is one learned row, ``UNK``, on input. On output the ``UNK`` column stands for
*all* unmapped ids together: its logit is fixed at ``log(n_unmapped)``, which is exactly the
log-sum-exp of ``n_unmapped`` logits of 0, what zero output rows give in the full-vocabulary GGUF
(:mod:`robot_latency.models.json_export`). The softmax trained is therefore the full model's, and
the model learns to beat every unused id (no grammar needed to keep them out).

The system prompt is a fixed prefix, the same for every row: each step runs it once at batch 1
and every row of the batch attends to its keys/values (``LlamaModel.forward_cached``), instead
of repeating its several hundred tokens per row. The prefix pass is forward only (no gradient
through the prefix's keys/values: the rows still attend to them at the positions llama.cpp
gives them, and the step costs a third less); rows are batched by length. Loss covers the
answer (plan and ``<|im_end|>``). Out-of-domain training rows have their unknown-word ids
replaced by ``UNK`` at random (:data:`UNK_DROPOUT`), so an id never seen in training reads as
"refuse".

    python -m robot_latency.models.json_train --out build/json   # 2,100 s of training
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from robot_latency.models.corpus import CorpusConfig, generate_corpus
from robot_latency.models.export import GGUFShape
from robot_latency.models.json_corpus import (
    TOKENIZER_FAMILY,
    JsonCorpus,
    JsonExample,
    build_json_corpus,
)
from robot_latency.models.torch_llama import KV, LlamaModel
from robot_latency.profiles.actions import REFUSE_ACTION
from robot_latency.profiles.vocab import VocabTokenizer

__all__ = ["JSON_SHAPE", "JsonTrainConfig", "TokenMap", "greedy_json", "main", "train_json"]

logger = logging.getLogger(__name__)

# Heads of 32 like the action planner's (and packable into Qwen2.5's heads of 64 and 128 by
# models/inflate.py); 128 wide, the action planner's draft's width (which matched its 256-wide
# target on held-out commands): on a shared, busy 2-core machine a 256-wide model saw too few
# rows in the training budget (8.6 s a step measured at 192 wide, load 7).
JSON_SHAPE = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=344)
#: Chance that an out-of-domain training row's unknown-word id is read as UNK.
UNK_DROPOUT = 0.3


@dataclass(frozen=True)
class TokenMap:
    """The Qwen2 ids the model has rows for; compact id ``i`` is ``ids[i]``, ``unk`` the rest.

    Attributes:
        ids: mapped real ids, sorted.
        n_vocab: the full vocabulary's size.
    """

    ids: tuple[int, ...]
    n_vocab: int

    @property
    def unk(self) -> int:
        """The compact id of every unmapped id (input) and of all of them together (output)."""
        return len(self.ids)

    @property
    def size(self) -> int:
        """Compact vocabulary size (mapped ids and ``UNK``)."""
        return len(self.ids) + 1

    @property
    def unk_logit(self) -> float:
        """``log(n_unmapped)``: the fixed logit of the ``UNK`` output column."""
        return math.log(self.n_vocab - len(self.ids))

    def compact(self, real: Sequence[int]) -> list[int]:
        """Map real ids to compact ids (unmapped ones to ``unk``)."""
        index = self._index()
        return [index.get(int(t), self.unk) for t in real]

    def real(self, compact: Sequence[int]) -> list[int]:
        """Map compact ids back (``unk`` to -1: no single real id)."""
        return [self.ids[c] if c < len(self.ids) else -1 for c in compact]

    def _index(self) -> dict[int, int]:
        cached = self.__dict__.get("_idx")
        if cached is None:
            cached = {t: i for i, t in enumerate(self.ids)}
            object.__setattr__(self, "_idx", cached)
        return cached


def token_map(corpus: JsonCorpus, n_vocab: int) -> TokenMap:
    """Return the map of every id in the prefix and the training rows."""
    ids = set(corpus.prefix) | {corpus.end_of_turn}
    for e in corpus.train:
        ids.update(e.suffix)
        ids.update(e.answer)
    return TokenMap(tuple(sorted(ids)), n_vocab)


@dataclass(frozen=True)
class JsonTrainConfig:
    """Optimisation settings (see :class:`robot_latency.models.train.TrainConfig`).

    ``budget_s``: train for this many wall seconds (at most ``steps``); the cosine decay runs over
    the elapsed fraction of the budget instead of the step count, so a busy machine trains fewer
    steps but still ends with the learning rate decayed, on time. None: ``steps`` steps.
    """

    steps: int = 100_000
    budget_s: float | None = 2100.0
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.05
    seed: int = 0
    threads: int = 2
    context_length: int = 1024


def _unk_head(logits: torch.Tensor, tmap: TokenMap) -> torch.Tensor:
    """Fix the ``UNK`` column at ``log(n_unmapped)`` (all unused ids together)."""
    keep = torch.ones(tmap.size)
    keep[tmap.unk] = 0.0
    const = torch.zeros(tmap.size)
    const[tmap.unk] = tmap.unk_logit
    return logits * keep + const


@dataclass(frozen=True)
class _Row:
    suffix: tuple[int, ...]
    answer: tuple[int, ...]
    ood: tuple[int, ...]  # suffix positions that may be read as UNK


def _rows(examples: Sequence[JsonExample], tmap: TokenMap) -> list[_Row]:
    in_domain = {t for e in examples if e.command.steps[0].action != REFUSE_ACTION
                 for t in e.suffix}
    rows = []
    for e in examples:
        ood = ()
        if e.command.steps[0].action == REFUSE_ACTION:
            ood = tuple(i for i, t in enumerate(e.suffix) if t not in in_domain)
        rows.append(_Row(tuple(tmap.compact(e.suffix)), tuple(tmap.compact(e.answer)), ood))
    return rows


def _batch(rows: Sequence[_Row], unk: int, rng: random.Random
           ) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = []
    for r in rows:
        s = list(r.suffix)
        for i in r.ood:
            if rng.random() < UNK_DROPOUT:
                s[i] = unk
        seqs.append(s + list(r.answer))
    t = max(len(s) for s in seqs) - 1
    x = torch.zeros((len(seqs), t), dtype=torch.long)
    y = torch.full((len(seqs), t), -100, dtype=torch.long)
    for i, (s, r) in enumerate(zip(seqs, rows, strict=True)):
        x[i, : len(s) - 1] = torch.tensor(s[:-1])
        p = len(r.suffix)
        y[i, p - 1 : len(s) - 1] = torch.tensor(s[p:])
    return x, y


def _bucketed(rows: Sequence[_Row], batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of batches of similar lengths (rows run 20 to 170 tokens: less padding)."""
    order = list(range(len(rows)))
    rng.shuffle(order)
    window = batch_size * 32
    out = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window],
                       key=lambda i: len(rows[i].suffix) + len(rows[i].answer))
        out.extend(chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size))
    rng.shuffle(out)
    return out


def _init_state(path: Path, tmap: TokenMap) -> dict[str, torch.Tensor]:
    """Weights to start from: a ``ckpt.pt`` or a compact GGUF (the shipped model) whose id map is
    ``tmap``'s."""
    if path.suffix != ".gguf":
        return torch.load(path)
    from robot_latency.models.json_export import read_compact

    _, tensors, ids, n_vocab, _ = read_compact(path)
    if tuple(ids) != tmap.ids or n_vocab != tmap.n_vocab:
        raise ValueError(f"{path}: its id map ({len(ids)} ids of {n_vocab}) is not this corpus's "
                         f"({len(tmap.ids)} of {tmap.n_vocab})")
    return {k: torch.from_numpy(v.astype("float32")) for k, v in tensors.items()}


def train_json(shape: GGUFShape, corpus: JsonCorpus, tmap: TokenMap, cfg: JsonTrainConfig, *,
               checkpoint: Path | None = None, init: Path | None = None
               ) -> tuple[LlamaModel, list[float], float, int]:
    """Train from scratch; return the model (eval mode), the loss per 25 steps, wall seconds and
    the steps taken.

    Args:
        shape: hyper-parameters (vocab_size is the map's size).
        corpus: the tokenized corpus.
        tmap: the id map.
        cfg: optimisation settings.
        checkpoint: save the weights here every 100 steps (and at the end).
        init: start from these weights (a checkpoint of the same shape, or a compact GGUF such as
            the shipped one) instead of random ones.
    """
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model = LlamaModel(shape)
    if init is not None:
        model.load_state_dict(_init_state(init, tmap))
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0}], lr=cfg.lr, betas=(0.9, 0.98))
    rows = _rows(corpus.train, tmap)
    prefix = torch.tensor([tmap.compact(corpus.prefix)])
    batches: list[list[int]] = []
    losses: list[float] = []
    running: list[float] = []
    t0 = time.perf_counter()
    done = 0
    model.train()
    for step in range(cfg.steps):
        if not batches:
            batches = _bucketed(rows, cfg.batch_size, rng)
        x, y = _batch([rows[i] for i in batches.pop()], tmap.unk, rng)
        elapsed = time.perf_counter() - t0
        if cfg.budget_s is not None and elapsed >= cfg.budget_s:
            break
        frac = ((elapsed / cfg.budget_s) if cfg.budget_s is not None
                else (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
        lr = (cfg.lr * (step + 1) / cfg.warmup if step < cfg.warmup
              else cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.no_grad():  # (1, P): once per step, shared by the batch, forward only
            _, past = model.forward_cached(prefix)
        logits, _ = model.forward_cached(x, past)
        logits = _unk_head(logits, tmap)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done += 1
        running.append(loss.item())
        if (step + 1) % 25 == 0 or step + 1 == cfg.steps:
            losses.append(sum(running) / len(running))
            running = []
            logger.info("step %d/%d loss %.4f lr %.2e (%.0f s)", step + 1, cfg.steps, losses[-1],
                        lr, time.perf_counter() - t0)
        if checkpoint is not None and (step + 1) % 100 == 0:
            torch.save(model.state_dict(), checkpoint)
    if running:
        losses.append(sum(running) / len(running))
    if checkpoint is not None:
        torch.save(model.state_dict(), checkpoint)
    model.eval()
    logger.info("trained %d steps in %.0f s", done, time.perf_counter() - t0)
    return model, losses, time.perf_counter() - t0, done


@torch.no_grad()
def greedy_json(model: LlamaModel, tmap: TokenMap, prefix: Sequence[int],
                suffixes: Sequence[Sequence[int]], *, end: int, max_new: int = 200,
                chunk: int = 64) -> list[list[int]]:
    """Decode greedily with a KV cache over the full vocabulary (``UNK`` = any unused id).

    Args:
        model: the model.
        tmap: the id map.
        prefix: the fixed prefix (real ids).
        suffixes: per-row prompt continuations (real ids).
        end: ``<|im_end|>``'s real id (stops a row).
        max_new: most tokens per row.
        chunk: rows decoded together.

    Returns:
        Real ids per row, ``end`` included when it came, -1 for an unused id (which ends it).
    """
    model.eval()
    _, past0 = model.forward_cached(torch.tensor([tmap.compact(prefix)]))
    outs: list[list[int]] = [[] for _ in suffixes]
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(suffixes):
        by_len.setdefault(len(s), []).append(i)
    end_c = tmap.compact([end])[0]
    for idxs in by_len.values():
        for start in range(0, len(idxs), chunk):
            part = idxs[start:start + chunk]
            x = torch.tensor([tmap.compact(suffixes[i]) for i in part])
            past: list[KV] = past0
            done = torch.zeros(len(part), dtype=torch.bool)
            for _ in range(max_new):
                logits, past = model.forward_cached(x, past)
                nxt = _unk_head(logits[:, -1], tmap).argmax(-1)
                for j, i in enumerate(part):
                    if not done[j]:
                        outs[i].append(tmap.real([int(nxt[j])])[0])
                done |= (nxt == end_c) | (nxt == tmap.unk)
                if bool(done.all()):
                    break
                x = nxt[:, None]
    return outs


def score(outputs: Sequence[Sequence[int]], examples: Sequence[JsonExample],
          refusal: Sequence[int]) -> dict[str, float]:
    """Return exact match and the refused fraction of ``outputs`` against the rows' answers."""
    n = max(1, len(examples))
    exact = sum(list(o) == list(e.answer) for o, e in zip(outputs, examples, strict=True))
    refused = sum(list(o) == list(refusal) for o in outputs)
    return {"exact_match": round(exact / n, 4), "refused": round(refused / n, 4),
            "n": len(examples)}


def main(argv: Sequence[str] | None = None) -> int:
    """Build the corpus, train, evaluate in torch and write the compact model and its manifest."""
    from robot_latency.models.json_export import write_compact

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--steps", type=int, default=JsonTrainConfig.steps)
    ap.add_argument("--budget-s", type=float, default=JsonTrainConfig.budget_s,
                    help="train for this many wall seconds (0: exactly --steps steps)")
    ap.add_argument("--batch-size", type=int, default=JsonTrainConfig.batch_size)
    ap.add_argument("--lr", type=float, default=JsonTrainConfig.lr)
    ap.add_argument("--dim", type=int, default=JSON_SHAPE["dim"])
    ap.add_argument("--layers", type=int, default=JSON_SHAPE["n_layers"])
    ap.add_argument("--n-train", type=int, default=CorpusConfig.n_train)
    ap.add_argument("--threads", type=int, default=JsonTrainConfig.threads,
                    help="torch threads (1 where another job has the other core)")
    ap.add_argument("--init", type=Path, default=None,
                    help="continue from this checkpoint (ckpt.pt of the same shape) or compact "
                    "GGUF (robot_latency/data/models/planner-json.compact.gguf)")
    ap.add_argument("--n-eval", type=int, default=None,
                    help="evaluate on this many held-out rows (and half as many refusals)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    t_start = time.perf_counter()
    ccfg = CorpusConfig(n_train=args.n_train)
    with VocabTokenizer.for_family(TOKENIZER_FAMILY) as tok:
        corpus = build_json_corpus(generate_corpus(ccfg), tok)
        n_vocab = tok.n_vocab
    tmap = token_map(corpus, n_vocab)
    cfg = JsonTrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                          budget_s=args.budget_s or None, threads=args.threads)
    dims = {**JSON_SHAPE, "dim": args.dim, "n_layers": args.layers, "n_heads": args.dim // 32,
            "n_kv_heads": args.dim // 64,
            "ffn_dim": int(JSON_SHAPE["ffn_dim"] * args.dim / JSON_SHAPE["dim"]) // 8 * 8}
    shape = GGUFShape(vocab_size=tmap.size, context_length=cfg.context_length, **dims)
    longest = len(corpus.prefix) + max(len(e.suffix) + len(e.answer)
                                       for e in corpus.train + corpus.heldout)
    logger.info("corpus: %d train, %d held-out, %d refusal held-out; prefix %d tokens, longest "
                "%d; %d mapped ids", len(corpus.train), len(corpus.heldout),
                len(corpus.refuse_heldout), len(corpus.prefix), longest, len(tmap.ids))
    if longest > cfg.context_length:
        raise ValueError(f"longest row {longest} exceeds context {cfg.context_length}")
    args.out.mkdir(parents=True, exist_ok=True)
    model, losses, wall, steps = train_json(shape, corpus, tmap, cfg,
                                            checkpoint=args.out / "ckpt.pt", init=args.init)
    refusal = next(e.answer for e in corpus.refuse_heldout)
    figures = {}
    n_eval = args.n_eval or len(corpus.heldout)
    for name, rows in (("heldout", corpus.heldout[:n_eval]),
                       ("refuse_heldout", corpus.refuse_heldout[:max(1, n_eval // 2)])):
        outs = greedy_json(model, tmap, corpus.prefix, [e.suffix for e in rows],
                           end=corpus.end_of_turn)
        figures[name] = score(outs, rows, refusal)
        logger.info("%s: %s", name, figures[name])
    path = write_compact(args.out / "planner-json.compact.gguf", shape, model.gguf_tensors(),
                         tmap)
    meta = {"shape": asdict(shape), "train": asdict(cfg), "steps_done": steps,
            "n_params": model.n_params(),
            "train_wall_s": round(wall, 1), "final_loss": round(losses[-1], 5) if losses else None,
            "torch_greedy": figures, "corpus": {**asdict(ccfg), "train_rows": len(corpus.train),
                                                "prefix_tokens": len(corpus.prefix)},
            "mapped_ids": len(tmap.ids), "n_vocab": tmap.n_vocab,
            "build_wall_s": round(time.perf_counter() - t_start, 1),
            "torch_version": torch.__version__, "compact_file": path.name}
    (args.out / "train.json").write_text(json.dumps(meta, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
