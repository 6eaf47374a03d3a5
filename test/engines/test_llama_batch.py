"""Batched greedy decoding through real llama.cpp gives the batch-1 engine's outputs exactly.

The shipped JSON planner (its chat prompt shares a long fixed prefix) and the compact planner
(no prefix): every command of a stream's start, fewer sequences than commands so that finished
sequences hand their slots on, compared token by token with the engine's own ``generate`` run in
order, prompt caching included.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from robot_latency.engines import EngineError, GenerationRequest, create_engine
from robot_latency.engines.llama_batch import greedy_batch
from robot_latency.models.bundled import bundled_model_path
from robot_latency.profiles.profile import load_planning
from robot_latency.streams import SHIPPED_DIR, read_stream


def _requests(profile: str, n: int) -> list[GenerationRequest]:
    planning = load_planning(profile or None)
    out = []
    for c in read_stream(SHIPPED_DIR / "steady_operator").commands[:n]:
        p = planning.build(c.text, c.state)
        out.append(GenerationRequest(prompt=p.suffix, prefix=p.prefix,
                                     max_tokens=planning.max_tokens,
                                     grammar=planning.contract.grammar, stop=planning.stop,
                                     complete=planning.contract.kind))
    return out


@pytest.mark.parametrize(("model", "profile", "n", "n_seq"),
                         [("planner-json", "bundled-json", 7, 3), ("planner", "", 9, 4)])
def test_batched_outputs_are_the_batch_1_engines(model: str, profile: str, n: int,
                                                 n_seq: int) -> None:
    requests = _requests(profile, n)
    warm = requests[0].prefix
    options = {"model_path": str(bundled_model_path(model)), "n_threads": 1}
    with create_engine("llamacpp", **options, warm_prefix=warm) as engine:
        traces = [engine.generate(r) for r in requests]
    with create_engine("llamacpp", **options) as engine:
        outs = greedy_batch(engine, requests, n_seq=n_seq, warm_prefix=warm)
    assert len(outs) == len(traces)
    for o, t in zip(outs, traces, strict=True):
        assert list(o.tokens) == t.tokens
        assert (o.text, o.stop_reason) == (t.text, t.stop_reason)
        assert len(o.prompt_tokens) == t.prompt_tokens
        assert o.prefix_cache_tokens == t.prefix_cache_tokens
    if warm:  # the fixed prefix is cached for every command after the first
        assert all(o.prefix_cache_tokens >= len(engine._prefix(warm)) for o in outs)


def test_requests_it_cannot_batch_are_refused() -> None:
    requests = _requests("", 2)
    with create_engine("llamacpp", model_path=str(bundled_model_path("planner")),
                       n_threads=1) as engine:
        with pytest.raises(EngineError, match="one prefix"):
            greedy_batch(engine, [requests[0], replace(requests[1], prefix="x")])
        with pytest.raises(EngineError, match="greedy requests without a deadline"):
            greedy_batch(engine, [replace(requests[0], deadline_ns=1)])
        with pytest.raises(EngineError, match="exceeds the context"):
            greedy_batch(engine, [replace(requests[0], max_tokens=10**7)])
        assert greedy_batch(engine, []) == []
