"""The engine worker counts the tokens of the generation in flight where the loop's side can read
them while it runs (the action's feedback does): a real worker process, the simulated engine."""

from __future__ import annotations

import threading
import time

from robot_latency.engines import GenerationRequest
from robot_latency.planner.worker import ProcessRunner

CUP = "pick up the red cup and put it on the tray"


def test_generated_tokens_rise_while_the_generation_runs_and_reset_after() -> None:
    # a slow simulated device: each token takes tens of ms, so the count is read mid-way
    runner = ProcessRunner("sim", {"device": "orin-nano-4gb", "efficiency": 0.05,
                                   "jitter_sigma": 0.0},
                           worker_nice=0)
    seen: list[int] = []
    with runner:
        runner.start()
        assert runner.generated_tokens() is None  # nothing in flight
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                n = runner.generated_tokens()
                if n is not None:
                    seen.append(n)
                time.sleep(0.002)

        watcher = threading.Thread(target=watch)
        watcher.start()
        request = GenerationRequest(prompt=CUP, max_tokens=8)
        outcome = runner.run(request, give_up_ns=time.perf_counter_ns() + 60 * 10**9)
        stop.set()
        watcher.join()
    assert outcome.status == "ok" and outcome.trace is not None
    produced = len(outcome.trace.token_ns)
    assert seen and seen == sorted(seen)  # counts only rise within one generation
    assert 0 < max(seen) <= produced
    assert runner.generated_tokens() is None
