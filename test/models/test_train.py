"""Training smoke test and torch/llama.cpp equality (needs torch)."""

from __future__ import annotations

import platform

import llama_cpp  # noqa: F401  (a hard requirement: a missing one fails)
import numpy as np
import pytest

if platform.machine() in ("x86_64", "AMD64"):
    import torch  # requirements/test.txt installs it on x86-64: a missing one fails here
else:
    torch = pytest.importorskip(
        "torch", reason="torch is installed for the tests on x86-64 only (requirements/test.txt)")

from robot_latency.models import bundled
from robot_latency.models.corpus import (
    CorpusConfig,
    corpus_config_from_dict,
    generate_corpus,
)
from robot_latency.models.evaluate import GGUFPlanner
from robot_latency.models.export import GGUFShape, export_gguf, read_gguf
from robot_latency.models.tokenizer import PlannerTokenizer
from robot_latency.models.torch_llama import LlamaModel
from robot_latency.models.train import (
    TrainConfig,
    build_examples,
    greedy_decode,
    train_model,
)

TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    corpus = generate_corpus(CorpusConfig(seed=3, n_train=300, n_heldout=20))
    with PlannerTokenizer(workdir=tmp_path_factory.mktemp("vocab")) as tok:
        return tok.vocab, build_examples(corpus.train, tok), corpus


def test_training_smoke_exports_loadable_gguf(data, tmp_path) -> None:
    vocab, train, corpus = data
    shape = GGUFShape(vocab_size=vocab.size, **TINY)
    res = train_model(shape, train, TrainConfig(steps=6, batch_size=16, warmup=2, threads=2))
    assert len(res.losses) == 1 and np.isfinite(res.losses[0])
    path = export_gguf(tmp_path / "tiny.gguf", shape, res.model.gguf_tensors(), vocab=vocab)
    back_shape, back = read_gguf(path)
    assert back_shape.dim == shape.dim and back_shape.n_layers == shape.n_layers
    np.testing.assert_array_equal(back["output.weight"], res.model.gguf_tensors()["output.weight"])

    # llama.cpp computes the same logits as torch (RoPE convention, GQA grouping, norms).
    with GGUFPlanner(path, kv_f32=True) as planner:
        for cmd in corpus.heldout[:5]:
            ids = planner.prompt(cmd.text) + [vocab.id(t) for t in cmd.plan_tokens]
            got = planner.logits(ids)
            with torch.no_grad():
                want = res.model(torch.tensor([ids]))[0].numpy()
            np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)


def test_shipped_target_torch_equals_llama_cpp() -> None:
    model = LlamaModel.from_gguf(bundled.bundled_model_path())
    cfg = corpus_config_from_dict(bundled.load_manifest()["corpus"])
    heldout = generate_corpus(cfg).heldout[:100]
    with GGUFPlanner(bundled.bundled_model_path(), kv_f32=True) as planner:
        prompts = [planner.prompt(c.text) for c in heldout]
        from_llama = [planner.greedy(c.text) for c in heldout]
    from_torch = greedy_decode(model, prompts, eos=planner.eos)
    assert from_torch == from_llama


def test_a_build_continues_from_the_shipped_models_of_the_same_vocabulary() -> None:
    # --init-from on the shipped directory: the vocabulary (with <refuse>) is read from the file
    from robot_latency.models.grow import gguf_tokens, grown_model
    from robot_latency.models.tokenizer import build_vocab

    vocab = build_vocab()
    path = bundled.bundled_model_path()
    assert gguf_tokens(path) == vocab.tokens
    grown = grown_model(path, vocab)
    shipped = LlamaModel.from_gguf(path)
    for name, value in shipped.state_dict().items():
        torch.testing.assert_close(grown.state_dict()[name], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"not in the new vocabulary"):
        grown_model(path, vocab, tuple(t + "x" for t in vocab.tokens))
