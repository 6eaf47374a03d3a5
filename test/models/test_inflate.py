"""Function-preserving inflation at small scale: a random tiny llama into a made-up bigger shape
(same head_dim, head_dim 16 packed two to a head of head_dim 32 with rope_freqs, and a target
whose head_dim is not hidden / n_heads, as Qwen3's)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import gguf
import llama_cpp  # noqa: F401  (a hard requirement: a missing one fails)
import numpy as np
import pytest

from robot_latency.engines.greedy import greedy_plans
from robot_latency.floor.modelinfo import PRESETS, ModelShape, facts_from_gguf
from robot_latency.models import inflate as inf
from robot_latency.models.evaluate import GGUFPlanner
from robot_latency.models.export import GGUFShape, gguf_tensor_names
from robot_latency.models.ladder import build_ladder
from robot_latency.models.tokenizer import build_vocab

COMMANDS = [
    "pick up the red cup",
    "stop",
    "go to the kitchen slowly",
    "find the blue ball and put it on the tray",
    "hand it to me",
]
# Largest |logit difference| allowed between the small and the inflated model at F32 (llama.cpp,
# F32 KV cache). Measured ~2e-6 here; REFERENCE 8 saw 5e-3 at the Qwen2.5-0.5B shape.
LOGIT_ATOL = 1e-3

# head_dim 64, like the presets
SMALL = dict(dim=128, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=256)
BIG = ModelShape(
    id="made-up", name="MadeUp", architecture="llama", n_layers=5, hidden=384, n_heads=6,
    n_kv_heads=2, head_dim=64, ffn=640, vocab_size=build_vocab().size + 45,
    tied_embeddings=False, qkv_bias=False, context_length=128,
)


def _negative_logits(t: dict[str, np.ndarray]) -> None:
    """Make every real logit strongly negative: residual coordinate 0 is a constant +4 that no
    layer writes to, and every output row reads it with weight -50, so that a padded token's
    logit 0 beats them all."""
    t["token_embd.weight"][:, 0] = 4.0
    for name in t:
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            t[name][0, :] = 0.0
    t["output_norm.weight"][0] = 1.0
    t["output.weight"][:, 0] = -50.0


@pytest.fixture(scope="module")
def tiny_gguf(random_llama_gguf: Callable[..., Path]) -> Callable[..., Path]:
    """Write a random llama GGUF with the planner vocabulary (F32, fan-in scaled, context 128)."""
    return functools.partial(random_llama_gguf, matrix_std=None, context_length=128)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_gguf):
    d = tmp_path_factory.mktemp("inflate")
    small = tiny_gguf(d / "small.gguf", **SMALL)
    big = inf.inflate(small, BIG, d / "big.gguf", dtype="F32")
    return small, big


def test_inflated_shape(pair) -> None:
    _, big = pair
    prof = facts_from_gguf(big)
    got = (prof.n_layers, prof.hidden, prof.n_heads, prof.n_kv_heads, prof.ffn)
    assert got == (5, 384, 6, 2, 640)
    assert prof.vocab_size == BIG.vocab_size
    assert prof.head_dim == 64
    assert prof.tensor_types == {"F32": 4 * prof.params}
    reader = gguf.GGUFReader(str(big))
    eps = reader.get_field("llama.attention.layer_norm_rms_epsilon").contents()
    assert eps == pytest.approx(1e-5 * 128 / 384, rel=1e-5)
    types = reader.get_field("tokenizer.ggml.token_type").contents()
    assert types[-45:] == [inf.UNUSED_TOKEN_TYPE] * 45


def test_greedy_identical_and_logits_close(pair) -> None:
    small, big = pair
    v = build_vocab().size
    assert greedy_plans(small, COMMANDS) == greedy_plans(big, COMMANDS)
    with GGUFPlanner(small, kv_f32=True) as a, GGUFPlanner(big, kv_f32=True) as b:
        for cmd in COMMANDS:
            ids = a.prompt(cmd)
            assert b.prompt(cmd) == ids  # padded tokens never appear in tokenization
            la, lb = a.logits(ids), b.logits(ids)
            assert np.abs(la - lb[:, :v]).max() < LOGIT_ATOL
            assert np.all(lb[:, v:] == 0.0)  # padded vocabulary: logit exactly 0


def test_padding_wins_without_grammar_never_with_it(tmp_path, tiny_gguf) -> None:
    v = build_vocab().size
    small = tiny_gguf(tmp_path / "neg.gguf", **SMALL, edit=_negative_logits)
    big = inf.inflate(small, BIG, tmp_path / "neg-big.gguf", dtype="F32")
    with GGUFPlanner(big, kv_f32=True) as b:
        logits = b.logits(b.prompt(COMMANDS[0]))[-1]
        assert logits[:v].max() < 0
        assert int(np.argmax(logits)) >= v  # unconstrained argmax picks an <unused_N> token
    plans = greedy_plans(big, COMMANDS)
    assert all(t < v for plan in plans for t in plan)  # the grammar keeps to the real vocabulary
    assert plans == greedy_plans(small, COMMANDS)


def test_f16_and_ladder(tmp_path, tiny_gguf) -> None:
    small = tiny_gguf(tmp_path / "s.gguf", dim=256, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=512)
    big_shape = ModelShape(
        id="m", name="M", architecture="llama", n_layers=3, hidden=512, n_heads=8, n_kv_heads=2,
        head_dim=64, ffn=1024, vocab_size=build_vocab().size + 3, tied_embeddings=False,
        qkv_bias=False, context_length=128,
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    src = inf.inflate(small, big_shape, cache / "planner-inflated-m.F16.gguf", dtype="F16")
    man = build_ladder(src, cache, quants=("F16", "Q4_K_M"))
    assert man.name == "planner-inflated-m"
    assert man.path("F16") == src and man.levels["F16"].seconds == 0.0  # the source itself
    assert man.levels["Q4_K_M"].tensors["blk.0.ffn_up.weight"] == "Q4_K"
    assert len(greedy_plans(man.path("Q4_K_M"), COMMANDS[:2])) == 2


def test_head_placement_keeps_gqa_groups() -> None:
    small = GGUFShape(vocab_size=100, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=512)
    plan = inf.plan_inflation(small, "qwen2.5-0.5b")
    # Small heads 0,1 read KV head 0 -> big group 0 (heads 0..6); heads 2,3 -> group 1 (7..13).
    assert plan.q_slot == (0, 1, 7, 8)
    assert plan.big.dim == 896 and plan.big.n_layers == 24 and plan.big.vocab_size == 151936
    assert plan.big.norm_eps == pytest.approx(1e-5 * 256 / 896)
    assert plan.gain_scale == pytest.approx((256 / 896) ** 0.5)
    plan1b = inf.plan_inflation(small, "llama-3.2-1b")
    assert plan1b.q_slot == (0, 1, 4, 5)
    names = gguf_tensor_names(plan1b.big)
    assert names["blk.15.ffn_down.weight"] == (2048, 8192)
    assert names["output.weight"] == (128256, 2048)


def test_incompatible_shapes_refused() -> None:
    hd48 = GGUFShape(vocab_size=100, dim=192, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=512)
    with pytest.raises(inf.InflateError, match=r"head_dim 48 .* does not divide .* head_dim 64"):
        inf.plan_inflation(hd48, "qwen2.5-0.5b")
    hd128 = GGUFShape(vocab_size=100, dim=256, n_layers=4, n_heads=2, n_kv_heads=1, ffn_dim=512)
    with pytest.raises(inf.InflateError, match="head_dim 128"):
        inf.plan_inflation(hd128, "qwen2.5-0.5b")
    many_kv = GGUFShape(vocab_size=100, dim=256, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=512)
    with pytest.raises(inf.InflateError, match=r"n_kv_heads 4 does not fit .* 2 small KV heads"):
        inf.plan_inflation(many_kv, "qwen2.5-0.5b")
    with pytest.raises(inf.InflateError, match="unknown preset"):
        inf.plan_inflation(many_kv, "gpt-5")
    assert "qwen2.5-0.5b" in PRESETS


def test_pad_vocab() -> None:
    vocab = build_vocab()
    padded = inf.pad_vocab(vocab, vocab.size + 3)
    assert padded.tokens[-3:] == ("<unused_0>", "<unused_1>", "<unused_2>")
    assert padded.types[-3:] == (5, 5, 5)
    assert padded.eos_id == vocab.eos_id
    with pytest.raises(inf.InflateError):
        inf.pad_vocab(vocab, vocab.size - 1)


# Head packing: head_dim 16 (4 KV heads, 2 query heads each) into head_dim 32 with 2 KV heads of
# 5 query heads each. Spread: small KV 0,1,2,3 -> (big KV 0, sub 0), (1, 0), (0, 1), (1, 1); each
# big group needs 4 of its 5 query slots, the 5th is unused.
SMALL_HD16 = dict(dim=128, n_layers=3, n_heads=8, n_kv_heads=4, ffn_dim=256)
BIG_HD32 = ModelShape(
    id="made-up-hd32", name="MadeUpHd32", architecture="llama", n_layers=5, hidden=320,
    n_heads=10, n_kv_heads=2, head_dim=32, ffn=384, vocab_size=build_vocab().size + 7,
    tied_embeddings=False, qkv_bias=False, context_length=128,
)
LONG_COMMANDS = [
    "go to the kitchen slowly then pick up the red cup and the blue ball and put them on the "
    "tray and hand it to me",
    "find the blue ball in the living room and put it on the table then go to the door and stop",
]
# Same measure as LOGIT_ATOL, with packing: RoPE angles computed as base**(-2j/32) / factor in
# float32 differ from base**(-2i/16) by rounding; measured ~4e-6 here (prompts of 23-29 tokens).
PACKED_LOGIT_ATOL = 1e-3


@pytest.fixture(scope="module")
def packed_pair(tmp_path_factory, tiny_gguf):
    d = tmp_path_factory.mktemp("inflate-packed")
    small = tiny_gguf(d / "small16.gguf", **SMALL_HD16, seed=1)
    big = inf.inflate(small, BIG_HD32, d / "big32.gguf", dtype="F32")
    return small, big


def test_packed_plan() -> None:
    small = GGUFShape(vocab_size=100, dim=128, n_layers=3, n_heads=8, n_kv_heads=4, ffn_dim=256)
    plan = inf.plan_inflation(small, BIG_HD32)
    assert plan.pack == 2 and plan.q_scale == pytest.approx(2**0.5)
    assert plan.kv_slot == ((0, 0), (1, 0), (0, 1), (1, 1))
    # Query heads 0,1 (KV 0) -> group 0 slots 0,1; 2,3 (KV 1) -> group 1 (5..9) slots 0,1;
    # 4,5 (KV 2, sub-block 1) -> group 0 slots 2,3; 6,7 (KV 3) -> group 1 slots 2,3.
    assert plan.q_slot == (0, 1, 5, 6, 2, 3, 7, 8)
    freqs = np.array(plan.rope_freqs)
    assert freqs.shape == (16,)
    j = np.arange(16)
    # Each sub-block rotates with the small model's frequencies base**(-2i/16), i = j % 8.
    np.testing.assert_allclose(1e4 ** (-2 * j / 32) / freqs, 1e4 ** (-2 * (j % 8) / 16))
    assert freqs[0] == 1.0


def test_packed_plan_presets() -> None:
    planner = GGUFShape(vocab_size=798, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=688)
    qwen = inf.plan_inflation(planner, "qwen2.5-0.5b")  # 14/2 heads, head_dim 64
    assert qwen.pack == 2 and qwen.kv_slot == ((0, 0), (1, 0), (0, 1), (1, 1))
    assert qwen.q_slot == (0, 1, 7, 8, 2, 3, 9, 10)
    llama = inf.plan_inflation(planner, "llama-3.2-1b")  # 32/8 heads, head_dim 64
    assert llama.kv_slot == ((0, 0), (1, 0), (2, 0), (3, 0))
    assert llama.q_slot == (0, 1, 4, 5, 8, 9, 12, 13)


def test_packing_capacity_errors() -> None:
    # 8 KV heads of head_dim 16 need 4 sub-blocks per big KV head of head_dim 32: only 2.
    many_kv = GGUFShape(vocab_size=100, dim=128, n_layers=2, n_heads=8, n_kv_heads=8, ffn_dim=256)
    with pytest.raises(inf.InflateError, match=r"n_kv_heads 8 does not fit .* = 4 small KV"):
        inf.plan_inflation(many_kv, BIG_HD32)
    # 3 KV heads on 2 big ones: one hosts 2, whose 3 query heads each need 6 slots of 5.
    wide_groups = GGUFShape(vocab_size=9, dim=144, n_layers=2, n_heads=9, n_kv_heads=3, ffn_dim=99)
    with pytest.raises(inf.InflateError, match=r"query slots .* need 6 query heads .* only 5"):
        inf.plan_inflation(wide_groups, BIG_HD32)


def test_packed_inflated_file(packed_pair) -> None:
    _, big = packed_pair
    prof = facts_from_gguf(big)
    assert (prof.n_layers, prof.hidden, prof.n_heads, prof.n_kv_heads, prof.head_dim) == (
        5, 320, 10, 2, 32
    )
    reader = gguf.GGUFReader(str(big))
    assert reader.get_field("llama.rope.dimension_count").contents() == 32
    assert reader.get_field("llama.rope.freq_base").contents() == pytest.approx(1e4)
    (rope,) = [t for t in reader.tensors if t.name == inf.ROPE_FREQS]
    assert rope.tensor_type == gguf.GGMLQuantizationType.F32
    assert list(rope.shape) == [16]


def test_packed_greedy_identical_and_logits_close(packed_pair) -> None:
    small, big = packed_pair
    v = build_vocab().size
    commands = COMMANDS + LONG_COMMANDS
    with GGUFPlanner(small, kv_f32=True) as a, GGUFPlanner(big, kv_f32=True) as b:
        assert max(len(a.prompt(c)) for c in LONG_COMMANDS) >= 20  # RoPE positions matter
        for cmd in commands:
            ids = a.prompt(cmd)
            assert b.prompt(cmd) == ids
            la, lb = a.logits(ids), b.logits(ids)
            assert np.abs(la - lb[:, :v]).max() < PACKED_LOGIT_ATOL
            assert np.all(lb[:, v:] == 0.0)
    assert greedy_plans(small, commands) == greedy_plans(big, commands)


def test_packing_without_rope_freqs_differs(packed_pair, tmp_path, monkeypatch) -> None:
    """Control: with all-ones factors (plain RoPE of head_dim 32) the long prompts' logits move,
    so the comparison above does see RoPE, and rope_freqs is what makes it exact."""
    small, _ = packed_pair
    plan_inflation = inf.plan_inflation

    def ones(src, target):
        plan = plan_inflation(src, target)
        return dataclasses.replace(plan, rope_freqs=(1.0,) * len(plan.rope_freqs))

    monkeypatch.setattr(inf, "plan_inflation", ones)
    plain = inf.inflate(small, BIG_HD32, tmp_path / "plain-rope.gguf", dtype="F32")
    with GGUFPlanner(small, kv_f32=True) as a, GGUFPlanner(plain, kv_f32=True) as b:
        ids = a.prompt(LONG_COMMANDS[0])
        diff = np.abs(a.logits(ids) - b.logits(ids)[:, : build_vocab().size])
    assert diff[0].max() < PACKED_LOGIT_ATOL  # position 0: no rotation at all
    assert diff.max() > 100 * PACKED_LOGIT_ATOL


# Qwen3's layout at small scale: 6 heads of 64 in a 320-wide model (6 * 64 = 384 != 320).
BIG_WIDE_HEADS = ModelShape(
    id="made-up-wide-heads", name="MadeUpWideHeads", architecture="qwen3", n_layers=3,
    hidden=320, n_heads=6, n_kv_heads=2, head_dim=64, ffn=384,
    vocab_size=build_vocab().size + 5, tied_embeddings=True, qkv_bias=False, context_length=128,
)


def test_head_dim_not_hidden_over_heads(tmp_path, tiny_gguf) -> None:
    small = tiny_gguf(tmp_path / "small.gguf", **SMALL, seed=2)
    big = inf.inflate(small, BIG_WIDE_HEADS, tmp_path / "wide.gguf", dtype="F32")
    prof = facts_from_gguf(big)
    assert (prof.hidden, prof.n_heads, prof.n_kv_heads, prof.head_dim) == (320, 6, 2, 64)
    reader = gguf.GGUFReader(str(big))
    assert reader.get_field("llama.attention.key_length").contents() == 64
    assert reader.get_field("llama.attention.value_length").contents() == 64
    shapes = {t.name: list(t.shape) for t in reader.tensors}
    assert shapes["blk.0.attn_q.weight"] == [320, 384]  # ggml order: (in, out)
    assert shapes["blk.0.attn_output.weight"] == [384, 320]
    v = build_vocab().size
    # llama.cpp loads it and computes the small model's function
    with GGUFPlanner(small, kv_f32=True) as a, GGUFPlanner(big, kv_f32=True) as b:
        for cmd in COMMANDS:
            ids = a.prompt(cmd)
            la, lb = a.logits(ids), b.logits(ids)
            assert np.abs(la - lb[:, :v]).max() < LOGIT_ATOL
    assert greedy_plans(small, COMMANDS) == greedy_plans(big, COMMANDS)


def test_qwen3_plan() -> None:
    """The shipped planner's shape plans into Qwen3-0.6B: 4 of its head_dim-32 heads per 128."""
    planner = GGUFShape(vocab_size=798, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=688)
    plan = inf.plan_inflation(planner, "qwen3-0.6b")
    assert plan.pack == 4 and plan.big.head_dim == 128 and plan.big.dim == 1024
    names = gguf_tensor_names(plan.big)
    assert names["blk.0.attn_q.weight"] == (16 * 128, 1024)
    assert names["blk.0.attn_output.weight"] == (1024, 16 * 128)
