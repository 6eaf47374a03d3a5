"""The openai engine against a real llama-cpp-python server and a server that misbehaves on
purpose: streaming, the stream closed at give-up (the server aborts), every fault in the trace.

Assertions are on events (what the server saw, what the trace says), never on wall-clock gaps;
deadlines are generous hang guards.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from robot_latency.engines.base import GenerationRequest, StopReason, create_engine
from robot_latency.engines.llama_server import free_port
from robot_latency.engines.openai_server import OpenAIServerEngine, ServerCheckError, check_server
from robot_latency.profiles.profile import load_planning

GUARD_NS = 20_000_000_000  # a deadline that only a hang reaches


def _request(command: str = "pick up the red cup", *, deadline_ns: int | None = None,
             max_tokens: int = 24, grammar: bool = True,
             complete: str | None = None) -> GenerationRequest:
    planning = load_planning(None)
    prompt = planning.build(command)
    return GenerationRequest(
        prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=max_tokens,
        deadline_ns=deadline_ns if deadline_ns is not None else time.perf_counter_ns() + GUARD_NS,
        grammar=planning.contract.grammar if grammar else None, stop=planning.stop,
        messages=planning.messages(command), complete=complete)


@pytest.fixture()
def engine_for() -> Any:
    made: list[OpenAIServerEngine] = []

    def make(url: str, **options: Any) -> OpenAIServerEngine:
        engine = create_engine("openai", server_url=url, **options)
        made.append(engine)
        return engine
    yield make
    for engine in made:
        engine.close()


# --- a real server ---------------------------------------------------------------------------
def test_streams_a_valid_plan_from_llama_cpp_python_server(llama_server: Any,
                                                           engine_for: Any) -> None:
    engine = engine_for(llama_server.url)
    assert engine.kind == "llamacpp" and engine.check_error is None
    trace = engine.generate(_request())
    assert trace.stop_reason is StopReason.DONE, trace.error
    plan = load_planning(None).contract.parse(trace.text)
    assert plan["steps"]
    server = trace.server
    assert server is not None and server["api"] == "completions"
    assert server["finish_reason"] == "stop"
    # One stamp per chunk with text, in arrival order, after the request was sent.
    assert trace.token_ns == sorted(trace.token_ns) and trace.token_ns[0] >= trace.started_ns
    assert server["text_chunks"] == len(trace.token_ns) >= 1
    # llama-cpp-python streams no usage: the count is the chunks', and the record says so.
    assert server["tokens_counted_by"] == "chunks"
    assert server["completion_tokens"] == len(trace.token_ns)


def test_chat_api_sends_the_profiles_messages(llama_server: Any, engine_for: Any) -> None:
    engine = engine_for(llama_server.url, server_api="chat")
    trace = engine.generate(_request("go to the kitchen"))
    assert trace.stop_reason is StopReason.DONE, trace.error
    assert trace.server is not None and trace.server["api"] == "chat"
    load_planning(None).contract.parse(trace.text)  # the grammar held on the chat endpoint too


def test_closing_the_stream_stops_the_server_generating_for_it(misbehaving_server: Any,
                                                              engine_for: Any) -> None:
    """Given up after its first chunk, the request's stream is closed and the server stops
    generating for it. The server is made slow per token on purpose ("slow": one chunk per
    20 ms for 30 s), so the request cannot finish before it is given up: its stream ends with
    the server's disconnect, never by running to its end, whatever the timing."""
    server = misbehaving_server
    engine = engine_for(server.url, server_model="slow")
    start = len(server.events)
    pending = engine.start(_request(max_tokens=100_000, grammar=False))
    _first_chunk(pending)
    trace = pending.cancel()
    assert trace.stop_reason is StopReason.ABORTED
    assert trace.server is not None and trace.server["closed_early"]

    def ends() -> list[tuple[str, str]]:
        return [e for e in server.events[start:] if e[0] in ("disconnected", "finished")]
    end = time.monotonic() + 2 * server.MAX_STREAM_S  # a hang guard: the stream ends either way
    while not ends() and time.monotonic() < end:
        time.sleep(0.01)
    assert server.events[start] == ("request", "slow")
    assert ends() == [("disconnected", "slow")], server.events[start:]


def test_a_closed_stream_frees_a_real_server_for_the_next_request(llama_server: Any,
                                                                  engine_for: Any) -> None:
    # A long unconstrained answer (end of text banned), given up after its first chunk.
    long = engine_for(llama_server.url, grammar=False,
                      request_extra={"logit_bias": {"4": -100.0}})
    pending = long.start(_request(max_tokens=800, grammar=False))
    _first_chunk(pending)
    trace = pending.cancel()
    assert trace.stop_reason is StopReason.ABORTED
    assert trace.server is not None and trace.server["closed_early"]
    # The next cycle's request is served (one request at a time on this server), whether the
    # server noticed the closed stream or finished the 800 tokens first.
    nxt = engine_for(llama_server.url).generate(_request("stop"))
    assert nxt.stop_reason is StopReason.DONE, nxt.error
    assert nxt.text.startswith("<stop>") or load_planning(None).contract.parse(nxt.text)


# --- faults ----------------------------------------------------------------------------------
def test_connection_refused_is_server_unreachable(engine_for: Any) -> None:
    engine = engine_for(f"http://127.0.0.1:{free_port()}/v1")
    assert engine.check_error is not None and "127.0.0.1" in engine.check_error
    trace = engine.generate(_request())
    assert trace.stop_reason is StopReason.ERROR
    assert trace.fault == "server_unreachable" and "connect" in (trace.error or "")


def test_the_engine_is_a_context_manager_that_stops_its_client_thread() -> None:
    with create_engine("openai", server_url=f"http://127.0.0.1:{free_port()}/v1") as engine:
        assert engine.generate(_request()).fault == "server_unreachable"
        assert engine._thread.is_alive()
    assert engine.closed and not engine._thread.is_alive()


def test_a_name_that_does_not_resolve_is_server_unreachable(engine_for: Any) -> None:
    engine = engine_for("http://robot-latency-test.invalid:8000/v1")
    trace = engine.generate(_request())
    assert trace.fault == "server_unreachable"
    assert "resolve" in (trace.error or "")


@pytest.mark.parametrize(("mode", "fault", "text"), [
    ("http500", "server_error", "HTTP 500"),
    ("http404", "server_error", "HTTP 404"),
    ("malformed", "server_malformed", "malformed"),
    ("error_event", "server_error", "overloaded"),
    ("no_finish", "invalid_output", "finish_reason"),
])
def test_each_fault_has_its_own_reason(misbehaving_server: Any, engine_for: Any, mode: str,
                                       fault: str, text: str) -> None:
    engine = engine_for(misbehaving_server.url, server_model=mode)
    trace = engine.generate(_request())
    assert trace.stop_reason is StopReason.ERROR
    assert trace.fault == fault
    assert text in (trace.error or "")


def _first_chunk(pending: Any) -> None:
    end = time.monotonic() + 60  # a hang guard
    while not pending.state.token_ns and not pending.done and time.monotonic() < end:
        time.sleep(0.001)
    assert pending.state.token_ns, "no chunk from the server"


def test_a_stall_mid_stream_ends_at_the_deadline_and_closes_the_stream(
        misbehaving_server: Any, engine_for: Any) -> None:
    engine = engine_for(misbehaving_server.url, server_model="stall")
    pending = engine.start(_request())
    _first_chunk(pending)
    give_up = time.perf_counter_ns() + 200_000_000  # the stall: nothing more comes
    trace = pending.wait(until_ns=give_up)
    assert trace.stop_reason is StopReason.DEADLINE
    assert trace.text == "<pick>" and len(trace.token_ns) == 1
    assert trace.finished_ns is not None and trace.finished_ns >= give_up
    assert misbehaving_server.wait_for(("disconnected", "stall"))
    # generate() gives up at the request's own deadline the same way.
    again = engine.generate(_request(deadline_ns=time.perf_counter_ns() + 200_000_000))
    assert again.stop_reason is StopReason.DEADLINE


def test_a_stall_given_up_is_a_deadline_even_when_the_cancel_lands_first(
        misbehaving_server: Any, engine_for: Any) -> None:
    """On a loaded host the cancelled request's own end (its coroutine's ``finally`` on the
    event-loop thread) could run before the giving-up thread took the trace, which then read
    "[DONE] without a finish_reason" (invalid_output) instead of the deadline. Here that order
    is forced: the cancel waits until the coroutine has ended."""
    engine = engine_for(misbehaving_server.url, server_model="stall")
    pending = engine.start(_request())
    _first_chunk(pending)
    real = pending.future

    class CancelThenWait:
        def cancel(self) -> bool:
            done = real.cancel()
            assert pending.state.done.wait(30), "the cancelled request never ended"
            return done

    pending.future = CancelThenWait()
    trace = pending.wait(until_ns=time.perf_counter_ns() + 100_000_000)
    assert pending.state.done.is_set()  # the forced order happened
    assert trace.stop_reason is StopReason.DEADLINE and trace.fault is None, trace.error
    assert trace.text == "<pick>" and trace.server is not None
    assert trace.server["closed_early"] and trace.server["fault"] is None


def test_the_next_cycle_is_never_held_by_the_last_ones_request(misbehaving_server: Any,
                                                               engine_for: Any) -> None:
    slow = engine_for(misbehaving_server.url, server_model="slow")
    pending = slow.start(_request())
    _first_chunk(pending)
    first = pending.wait(until_ns=time.perf_counter_ns() + 100_000_000)
    assert first.stop_reason is StopReason.DEADLINE and first.token_ns
    # The given-up request still streams on the server's side until it sees the disconnect;
    # the next cycle's request goes out at once and is answered in full.
    plan = engine_for(misbehaving_server.url, server_model="plan").generate(_request())
    assert plan.stop_reason is StopReason.DONE and plan.text == "<pick><col:red><obj:cup>"
    assert misbehaving_server.wait_for(("disconnected", "slow"))


def test_a_complete_plan_stops_the_stream_and_is_reported_complete(misbehaving_server: Any,
                                                                  engine_for: Any) -> None:
    # "endless_plan" streams a complete action plan (its <end> included), then more text and
    # no finish_reason: the contract's own check (the end token) stops it there.
    engine = engine_for(misbehaving_server.url, server_model="endless_plan")
    trace = engine.generate(_request(complete="actions"))
    assert trace.stop_reason is StopReason.COMPLETE, trace.error
    assert trace.text == "<pick><col:red><obj:cup><end>"
    load_planning(None).contract.parse(trace.text)
    assert trace.server is not None and trace.server["closed_early"]
    assert trace.server["finish_reason"] is None
    # The end is the chunk that completed the plan, not the moment the trace was collected.
    assert trace.finished_ns == trace.token_ns[-1]
    assert misbehaving_server.wait_for(("disconnected", "endless_plan"))
    # A request without a contract to complete reads on, as an in-process engine would: the
    # stream then ends at the deadline.
    more = engine.generate(_request(deadline_ns=time.perf_counter_ns() + 300_000_000))
    assert more.stop_reason is StopReason.DEADLINE
    assert more.text.startswith("<pick><col:red><obj:cup><end><pick>")


def test_a_finished_stream_keeps_the_time_its_finish_came(misbehaving_server: Any,
                                                          engine_for: Any) -> None:
    engine = engine_for(misbehaving_server.url, server_model="plan")
    pending = engine.start(_request())
    while not pending.done:
        time.sleep(0.001)
    # Collected after it ended: the trace says when the finish came.
    collected_after = time.perf_counter_ns()
    trace = pending.wait()
    assert trace.stop_reason is StopReason.DONE
    assert trace.finished_ns is not None and trace.token_ns[-1] <= trace.finished_ns
    assert trace.finished_ns < collected_after
    # Cancelling a stream that already ended keeps its own end too.
    assert pending.cancel() is trace


@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real llama-cpp-python server with a context long enough for instruct-json's prompt."""
    from robot_latency.engines.llama_server import LocalServer
    from robot_latency.models.bundled import bundled_model_path

    with LocalServer(bundled_model_path(), n_threads=1, n_ctx=4096,
                     log_path=tmp_path_factory.mktemp("json-server") / "server.log") as server:
        yield server


def test_a_json_plan_from_a_real_server_is_complete_at_its_closing_brace(
        json_server: Any, engine_for: Any) -> None:
    import json

    planning = load_planning("instruct-json")
    engine = engine_for(json_server.url, profile="instruct-json")
    prompt = planning.build("pick up the red cup")
    request = GenerationRequest(
        prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
        deadline_ns=time.perf_counter_ns() + GUARD_NS, grammar=planning.contract.grammar,
        stop=planning.stop, complete=planning.contract.kind)
    trace = engine.generate(request)
    assert trace.stop_reason is StopReason.COMPLETE, (trace.error, trace.text)
    assert trace.text.endswith("}") and planning.contract.parse(trace.text)
    assert json.loads(trace.text) == planning.contract.parse(trace.text)
    assert trace.finished_ns == trace.token_ns[-1]
    assert trace.server is not None and trace.server["closed_early"]


def test_check_server_names_the_url_in_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerCheckError) as err:
        check_server(url, timeout_s=2.0)
    assert url in str(err.value) and "\n" not in str(err.value)


def test_bad_settings_are_refused_with_the_field() -> None:
    from robot_latency.engines.base import EngineError

    with pytest.raises(EngineError, match="server_api"):
        create_engine("openai", server_url="http://127.0.0.1:1/v1", server_api="embeddings")
    with pytest.raises(EngineError, match="server_url"):
        create_engine("openai", server_url="ftp://robot")


def test_an_interrupted_answer_is_not_taken_as_a_complete_plan(tmp_path: Any,
                                                               engine_for: Any) -> None:
    """llama-cpp-python's server with its default ``interrupt_requests`` ends the stream in
    progress with ``[DONE]`` and no finish_reason when another request arrives."""
    from robot_latency.engines.llama_server import LocalServer
    from robot_latency.models.bundled import bundled_model_path

    with LocalServer(bundled_model_path(), n_threads=1, log_path=tmp_path / "server.log",
                     extra_args=("--interrupt_requests", "true")) as server:
        long = engine_for(server.url, grammar=False,
                          request_extra={"logit_bias": {"4": -100.0}})
        first = long.start(_request(max_tokens=800, grammar=False))
        _first_chunk(first)
        second = engine_for(server.url).start(_request("stop"))
        trace = first.wait()
        assert trace.stop_reason is StopReason.ERROR
        assert trace.fault == "invalid_output" and "finish_reason" in (trace.error or "")
        assert trace.server is not None and trace.server["finish_reason"] is None
        assert second.wait().stop_reason is StopReason.DONE


def test_a_server_that_comes_up_later_is_learnt_then(tmp_path: Any, engine_for: Any) -> None:
    from robot_latency.engines.llama_server import LocalServer
    from robot_latency.models.bundled import bundled_model_path

    port = free_port()
    engine = engine_for(f"http://127.0.0.1:{port}/v1")
    assert engine.check_error is not None and engine.kind == "auto"
    assert engine.generate(_request()).fault == "server_unreachable"
    with LocalServer(bundled_model_path(), port=port, n_threads=1,
                     log_path=tmp_path / "server.log"):
        trace = engine.generate(_request())
    assert trace.stop_reason is StopReason.DONE, trace.error
    # Model and kind learnt from the server once it answered: the grammar went with the request.
    assert engine.kind == "llamacpp" and engine.model
    assert trace.server is not None and trace.server["kind"] == "llamacpp"


def test_the_local_server_keeps_only_the_last_tokens_logits(llama_server: Any) -> None:
    """Started with ``--logits_all false``: llama-cpp-python's default computes the output layer
    for every prompt token (a slower prompt evaluation than in-process); a server started that
    way refuses ``logprobs``, which needs them."""
    import httpx

    body = {"prompt": "pick up the red cup", "max_tokens": 2, "logprobs": 1}
    answer = httpx.post(llama_server.url + "/completions", json=body, timeout=60.0)
    assert answer.status_code >= 400, answer.text[:200]
    assert "logits_all" in answer.text
    plain = httpx.post(llama_server.url + "/completions",
                       json={"prompt": "pick up the red cup", "max_tokens": 2}, timeout=60.0)
    assert plain.status_code == 200, plain.text[:200]
