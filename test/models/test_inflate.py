"""Function-preserving inflation at small scale: a random tiny llama into a made-up bigger shape."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

from robot_latency.floor.modelinfo import PRESETS, ModelShape, profile_from_gguf  # noqa: E402
from robot_latency.models import inflate as inf  # noqa: E402
from robot_latency.models.evaluate import GGUFPlanner  # noqa: E402
from robot_latency.models.export import GGUFShape, export_gguf, gguf_tensor_names  # noqa: E402
from robot_latency.models.ladder import build_ladder, greedy_plans  # noqa: E402
from robot_latency.models.tokenizer import build_vocab  # noqa: E402

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

SMALL = dict(dim=128, n_layers=2, n_heads=2, n_kv=1, ffn=256)  # head_dim 64, like the presets
BIG = ModelShape(
    id="made-up", name="MadeUp", architecture="llama", n_layers=5, hidden=384, n_heads=6,
    n_kv_heads=2, head_dim=64, ffn=640, vocab_size=build_vocab().size + 45,
    tied_embeddings=False, qkv_bias=False, context_length=128,
)


def tiny_gguf(path, *, dim, n_layers, n_heads, n_kv, ffn, seed=0, negative_logits=False):
    """Write a random llama GGUF with the planner vocabulary (F32).

    negative_logits: make every real logit strongly negative (residual coordinate 0 is a constant
    +4 that no layer writes to, and every output row reads it with weight -50), so that a padded
    token's logit 0 beats them all.
    """
    vocab = build_vocab()
    shape = GGUFShape(vocab_size=vocab.size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                      n_kv_heads=n_kv, ffn_dim=ffn)
    rng = np.random.default_rng(seed)
    t = {}
    for name, tshape in gguf_tensor_names(shape).items():
        if len(tshape) == 1:
            t[name] = (1 + 0.1 * rng.standard_normal(tshape)).astype(np.float32)
        else:
            scale = 0.5 if name == "token_embd.weight" else tshape[1] ** -0.5
            t[name] = (rng.standard_normal(tshape) * scale).astype(np.float32)
    if negative_logits:
        t["token_embd.weight"][:, 0] = 4.0
        for name in t:
            if name.endswith(("attn_output.weight", "ffn_down.weight")):
                t[name][0, :] = 0.0
        t["output_norm.weight"][0] = 1.0
        t["output.weight"][:, 0] = -50.0
    return export_gguf(path, shape, t, vocab=vocab)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("inflate")
    small = tiny_gguf(d / "small.gguf", **SMALL)
    big = inf.inflate(small, BIG, d / "big.gguf", dtype="F32")
    return small, big


def test_inflated_shape(pair) -> None:
    _, big = pair
    prof = profile_from_gguf(big)
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


def test_padding_wins_without_grammar_never_with_it(tmp_path) -> None:
    v = build_vocab().size
    small = tiny_gguf(tmp_path / "neg.gguf", **SMALL, negative_logits=True)
    big = inf.inflate(small, BIG, tmp_path / "neg-big.gguf", dtype="F32")
    with GGUFPlanner(big, kv_f32=True) as b:
        logits = b.logits(b.prompt(COMMANDS[0]))[-1]
        assert logits[:v].max() < 0
        assert int(np.argmax(logits)) >= v  # unconstrained argmax picks an <unused_N> token
    plans = greedy_plans(big, COMMANDS)
    assert all(t < v for plan in plans for t in plan)  # the grammar keeps to the real vocabulary
    assert plans == greedy_plans(small, COMMANDS)


def test_f16_and_ladder(tmp_path) -> None:
    small = tiny_gguf(tmp_path / "s.gguf", dim=256, n_layers=2, n_heads=4, n_kv=2, ffn=512)
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
    hd32 = GGUFShape(vocab_size=100, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=512)
    with pytest.raises(inf.InflateError, match="head_dim 32"):
        inf.plan_inflation(hd32, "qwen2.5-0.5b")
    many_kv = GGUFShape(vocab_size=100, dim=256, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=512)
    with pytest.raises(inf.InflateError, match="n_kv_heads"):
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
