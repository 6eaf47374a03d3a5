"""The deadline-enforced planner loop: every cycle publishes exactly one plan by its deadline.

One cycle::

    scheduled ─► take newest command ─► prompt ─► runner.run(request, give_up at deadline-margin)
              ─► model plan complete, valid and in time? ── yes ─► publish (source "model")
              └─ no: fallback chain (rule, hold, stop) ─► publish (source "fallback", reason)
              ─► CycleRecord written (and flushed) before the next cycle starts

The loop reads one injected clock. Latency counts from the scheduled start, and ticks whose
deadline passed while an earlier cycle overran are recorded as skipped misses, not dropped.

Where the deadline starts: at the tick (periodic mode) or the command's arrival (event mode),
except for a command whose sender stamped its send on this clock (the client edge's tagged
commands): the receiver counts its deadline from the send, so the first cycle that plans it does
too, in both modes; the wait for a tick is then spent out of its budget (the queue phase). A
command whose budget is gone when it is planned keeps its lateness (the fallback, a miss).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock, sleep_until_for
from robot_latency.engines.base import FrameImage, GenerationRequest, GenerationTrace, StopReason
from robot_latency.planner.config import RunSettings
from robot_latency.planner.fallback import FallbackChain, FallbackContext
from robot_latency.planner.frame_policy import FramePolicy
from robot_latency.planner.mailbox import (
    InboundCommand,
    Mailbox,
    Withdrawals,
    is_withdrawn,
    withdrawal_interrupt,
)
from robot_latency.planner.margin import PublishMargin, TransportMargin
from robot_latency.planner.runner import (  # noqa: F401  (re-exported: the loop's runners)
    InlineRunner,
    Interrupt,
    Runner,
    RunOutcome,
    clip_trace,
)
from robot_latency.profiles.actions import PlanParseError
from robot_latency.profiles.contract import complete_plan
from robot_latency.profiles.profile import Planning
from robot_latency.records import FALLBACK_REASONS, CycleRecord, RecordError

log = logging.getLogger(__name__)

#: How long, after a cycle's plan is published, the loop waits at most for the aborted
#: generation's partial trace (its phases so far) before it writes the record without them. In
#: periodic mode never past the next tick. The wait costs the next cycle nothing it would not
#: spend anyway: the engine worker cannot start its request before it has answered this one.
PARTIAL_TRACE_WAIT_NS = 200_000_000

#: How often periodic mode's wait for a tick looks for a command that cannot wait for it.
TICK_POLL_NS = 5_000_000

Publisher = Callable[[dict[str, Any]], None]
RecordSink = Callable[[CycleRecord], None]


class PlannerLoop:
    """The planner: cycles, deadline enforcement, fallback, records.

    Args:
        config: the run's settings; the loop reads its loop fields
            (:data:`~robot_latency.planner.config.LOOP_FIELDS`).
        runner: runs the engine (see :class:`InlineRunner`).
        publish: called with the plan envelope, exactly once per cycle.
        sink: called with each cycle's record before the next cycle starts.
        clock: the one clock (ns).
        planning: the planner profile, loaded once by the builder (prompt, output contract,
            fallback pieces).
        run_id, floor: the run's id and floor predictions (host, target), in every record.
    """

    def __init__(self, config: RunSettings, runner: Runner, *, publish: Publisher,
                 sink: RecordSink, planning: Planning, clock: Clock = DEFAULT_CLOCK,
                 run_id: str | None = None,
                 floor: dict[str, Any] | None = None,
                 sleep_until: Callable[[int], None] | None = None) -> None:
        self.config, self.runner = config, runner
        self.publish, self.sink = publish, sink
        self.clock, self.planning = clock, planning
        self.run_id, self.floor = run_id or uuid.uuid4().hex[:12], floor
        #: the newest camera frame, read at each cycle's start: (its header stamp, its stamp
        #: on this clock, its image or None), or None (text only; CycleRecord.take_frame)
        self.frame_source: Callable[[], tuple[int, int, FrameImage | None] | None] | None = None
        self._image: FrameImage | None = None  # the cycle's frame, for a vision tower
        self.frame_policy = FramePolicy(config.image_policy, config.frame_scale)
        self.sleep_until = sleep_until or sleep_until_for(clock)
        self.mailbox = Mailbox(config.mailbox_capacity)
        self.fallback = FallbackChain.of_run(config.fallback,
                                             hold_max_age_ms=config.hold_max_age_ms,
                                             planning=self.planning)
        if self.fallback.dropped:
            log.info("fallback %s left out: profile %s has no rule planner",
                     ",".join(self.fallback.dropped), self.planning.profile.name)
        self.grammar = self.planning.contract.grammar if config.grammar else None
        self.max_tokens = config.max_tokens or self.planning.max_tokens
        self._state: str | None = None
        self.cycles_run = 0
        self._partial_pending = False
        self._given_up_ns = 0
        self._waited_to_give_up = False
        #: how long the loop waits, after the publish, for an aborted generation's trace
        self.partial_trace_wait_ns = PARTIAL_TRACE_WAIT_NS
        self.next_cycle = 0  # cycle ids run on across calls of the run_* methods
        self.sink_errors = 0
        self._current: InboundCommand | None = None
        self._last_command_id: str | None = None
        self._last_plan: dict[str, Any] | None = None
        self._last_plan_text: str | None = None  # the command the last plan was for
        self._last_plan_ns: int | None = None
        #: the transport margin (fixed, or measured from samples the ROS node adds)
        self.transport = TransportMargin(config.margin_settings())
        #: the loop's own share (fixed, or learned from its lateness at the give-up time)
        self.publish_margin = PublishMargin(config.publish_margin_settings())
        #: set by the driver of an event-mode run with on_new_command=preempt: True while a
        #: newer command waits (the running generation is then aborted)
        self.newer_command_waiting: Interrupt | None = None
        #: set by a source whose commands can be withdrawn (aborted, nothing published for it)
        self.withdrawals: Withdrawals | None = None
        self.running: InboundCommand | None = None  # the running cycle's (other threads read it)

    # --- one cycle ---------------------------------------------------------------------------
    def _command_problem(self, text: str) -> str | None:
        if not text.strip():
            return "empty command"
        if len(text) > self.config.max_command_chars:
            return (f"command of {len(text)} characters exceeds max_command_chars="
                    f"{self.config.max_command_chars}")
        if any(ord(c) < 32 and c not in "\t\n\r" for c in text) or "\ufffd" in text:
            return "command holds control characters or undecodable bytes"
        return None

    def run_cycle(self, cycle: int, scheduled_ns: int,
                  command: InboundCommand | None) -> CycleRecord:
        """Run one cycle for ``command`` (None: nothing to plan) and return its record.

        ``scheduled_ns`` is the tick (periodic mode) or the command's start (event mode). The
        first cycle for a command stamped with its send counts from that send instead.
        """
        self.running = command
        try:
            return self._run_cycle(cycle, scheduled_ns, command)
        finally:
            self.running = None

    def _run_cycle(self, cycle: int, scheduled_ns: int,
                   command: InboundCommand | None) -> CycleRecord:
        cfg = self.config
        started = self.clock()
        tick_ns = scheduled_ns
        # Reaction latency belongs to the first cycle that plans a command, not to re-plans.
        first_for_command = command is not None and command.command_id != self._last_command_id
        if first_for_command and command is not None and command.sent_ns is not None:
            scheduled_ns = command.start_ns  # before the tick, or after it (a late cycle)
        budget_ns = command.budget_ns(cfg.deadline_ns) if command else cfg.deadline_ns
        deadline = scheduled_ns + budget_ns
        publish_margin = self.publish_margin.margin_ns()
        margin = publish_margin + self.transport.margin_ns()
        give_up = deadline - margin
        self._waited_to_give_up = False
        rec = CycleRecord(run_id=self.run_id, cycle=cycle, scheduled_ns=scheduled_ns,
                          deadline_ns=deadline, started_ns=started, mode=cfg.mode,
                          command_id=command.command_id if command else None,
                          command_arrival_ns=command.arrival_ns if first_for_command else None,
                          floor=self.floor, margin_ns=margin)
        if first_for_command and command is not None:
            rec.command_sent_ns = command.sent_ns
        rec.data_ns = command.stamp_ns if command is not None else scheduled_ns  # plan's stamp
        frame = self.frame_source() if self.frame_source is not None else None
        rec.take_frame(frame)
        self._image, rec.image = self.frame_policy.choose(
            frame[2] if frame is not None else None, cycle, give_up - started)
        if command is not None:
            self._last_command_id = command.command_id
        rec.phases_ns["queue"] = started - scheduled_ns
        plan: dict[str, Any] | None = None
        reason: str | None
        text = command.text if command is not None else None
        problem = None if text is None else self._command_problem(text)
        if text is None:
            reason = "no_command"
        elif is_withdrawn(self.withdrawals, command):
            reason = "cancelled"
        elif problem is not None:
            log.warning("cycle %d, command %s: %s; falling back", cycle, rec.command_id, problem)
            reason = "bad_command"
            rec.engine_error = problem
            text = None  # the fallback must not read a bad command either
        elif started >= give_up:
            reason = "deadline"  # no time left to ask the model at all
        else:
            state = command.state if command is not None and command.state is not None \
                else self._state
            plan, reason = self._ask_model(rec, text, state, give_up)
        if reason != "cancelled" and is_withdrawn(self.withdrawals, command):
            reason = "cancelled"  # withdrawn while the model or the fallback answered
        if reason in ("superseded", "cancelled"):
            # on_new_command=preempt: a newer command arrived and the generation was aborted.
            # The older command gets no plan of its own (the newer one's follows at once); its
            # cycle is recorded as superseded, a miss, with the phases it ran. A withdrawn
            # command (cancelled) gets none either: its sender no longer waits for one.
            rec.plan_source, rec.fallback_reason = "none", reason
            if reason == "cancelled" and command is not None and self.withdrawals is not None:
                self.withdrawals.dropped(command.command_id)
            self._collect_partial(rec, tick_ns)
            self._write(rec)
            self.cycles_run += 1
            return rec
        if plan is None:
            t0 = self.clock()
            policy, plan = self.fallback.answer(FallbackContext(
                command=text, now_ns=t0, last_plan=self._last_plan,
                last_plan_ns=self._last_plan_ns, last_plan_command=self._last_plan_text))
            rec.plan_source, rec.fallback_reason, rec.fallback_policy = "fallback", reason, policy
            rec.phases_ns["fallback"] = self.clock() - t0
        else:
            rec.plan_source = "model"
        rec.plan = plan
        published = self.clock()
        rec.published_ns = published
        envelope = {
            "cycle": cycle, "command_id": rec.command_id, "source": rec.plan_source,
            "fallback_reason": rec.fallback_reason, "plan": plan,
            "deadline_met": published <= deadline, "cycle_ms": (published - scheduled_ns) / 1e6,
            "deadline_ms": budget_ns / 1e6, "margin_ms": margin / 1e6,
            "tokens_out": rec.tokens_out, "data_ns": rec.data_ns, "published_ns": published,
        }
        try:
            self.publish(envelope)
        except Exception as err:  # a failing publisher is reported, the loop goes on
            log.error("cycle %d: publish failed: %r", cycle, err)
            rec.engine_error = (rec.engine_error or "") + f" publish failed: {err!r}"
        rec.phases_ns["publish"] = self.clock() - published
        # How late the loop published after its give-up time (wake-up, parse or fallback,
        # publish call): past the publish margin it ate into the transport's, in any cycle that
        # started before it. Waking at it is the learned publish margin's sample.
        if self._waited_to_give_up and self.publish_margin.measured:
            self.publish_margin.add(published - give_up)
        if started < give_up and self.transport.measured:
            self.transport.add_loop_excess(published - (give_up + publish_margin))
        self._collect_partial(rec, tick_ns)
        if rec.plan_source == "model" or rec.fallback_policy == "rule":
            self._last_plan, self._last_plan_ns, self._last_plan_text = plan, published, text
        self._write(rec)
        self.cycles_run += 1
        return rec

    def set_state(self, text: str | None) -> None:
        """Set the robot state text the next cycles' prompts carry (thread-safe: one store)."""
        self._state = text

    def _ask_model(self, rec: CycleRecord, text: str, state: str | None,
                   give_up_ns: int) -> tuple[dict[str, Any] | None, str | None]:
        prompt = self.planning.build(text, state)
        rec.prompt = prompt.suffix
        request = GenerationRequest(prompt=prompt.suffix, prefix=prompt.prefix,
                                    max_tokens=self.max_tokens, deadline_ns=give_up_ns,
                                    grammar=self.grammar, stop=self.planning.stop,
                                    complete=self.planning.contract.kind,
                                    messages=self.planning.messages(text, state),
                                    image=self._image)
        interrupt = self.newer_command_waiting \
            if self.config.on_new_command == "preempt" and self.config.mode == "event" else None
        interrupt = withdrawal_interrupt(self.withdrawals, rec.command_id, interrupt)
        outcome = self.runner.run(request, give_up_ns=give_up_ns, interrupt=interrupt)
        trace = outcome.trace
        self._partial_pending = trace is None and outcome.status in ("timeout", "preempted")
        self._waited_to_give_up = outcome.status == "timeout"
        self._given_up_ns = self.clock()
        if trace is not None:
            self._copy_trace(rec, trace)
            self.frame_policy.learn(self._image, trace)
        if outcome.wait_ns:
            rec.phases_ns["worker_wait"] = outcome.wait_ns
        if outcome.status == "preempted":
            return None, "superseded"
        if outcome.status == "error":
            rec.engine_error = outcome.error
            fault = trace.fault if trace is not None else None
            return None, fault if fault in FALLBACK_REASONS else "engine_error"
        if outcome.status == "unavailable":
            rec.engine_error = outcome.error
            return None, "engine_unavailable"
        if outcome.status == "timeout" or trace is None:
            return None, "deadline"
        if trace.stop_reason not in (StopReason.DONE, StopReason.COMPLETE):
            # cut off at max_tokens: a plan only if it was already complete and valid
            plan = complete_plan(self.planning.contract, trace.text)
            return (plan, None) if plan is not None else (None, "invalid_output")
        try:
            plan = self.planning.contract.parse(trace.text)
        except PlanParseError as err:
            rec.engine_error = f"invalid plan: {err}"
            return None, "invalid_output"
        return plan, None

    def _collect_partial(self, rec: CycleRecord, tick_ns: int) -> None:
        """Copy the partial trace of a generation given up on into its record.

        Called after the plan is published, so it costs no cycle its deadline: the worker's
        engine answers an abort within milliseconds (docs/BENCHMARKS.md, "Engine: abort latency
        during a long prefill"), later on a loaded machine. Waits at most
        :attr:`partial_trace_wait_ns` (in periodic mode not past the tick after ``tick_ns``'s);
        a worker that does not answer by then is the next cycle's to wait for.
        """
        if not self._partial_pending:
            return
        self._partial_pending = False
        until = self.clock() + self.partial_trace_wait_ns
        if self.config.mode == "periodic":
            until = min(until, tick_ns + self.config.period_ns)
        trace = self.runner.collect_aborted(until)
        if trace is not None:
            self._copy_trace(rec, clip_trace(trace, self._given_up_ns))

    @staticmethod
    def _copy_trace(rec: CycleRecord, trace: GenerationTrace) -> None:
        rec.token_ns = [t for t in trace.token_ns if t >= rec.scheduled_ns]
        rec.tokens_in = trace.prompt_tokens
        rec.prefix_cache_tokens = trace.prefix_cache_tokens
        rec.stop_reason = trace.stop_reason.value
        rec.raw_output = trace.text
        rec.draft = trace.draft
        rec.offboard, rec.image = trace.server, trace.image or rec.image
        rec.phases_ns.update(trace.phases_ns())

    def _write(self, rec: CycleRecord) -> None:
        try:
            self.sink(rec)
        except (RecordError, OSError) as err:  # reported, never fatal to the loop
            self.sink_errors += 1
            log.error("cycle %d: record not written: %s", rec.cycle, err)

    def _skipped(self, cycle: int, scheduled_ns: int, command_id: str | None = None, *,
                 reason: str = "skipped", arrival_ns: int | None = None) -> None:
        rec = CycleRecord(run_id=self.run_id, cycle=cycle, scheduled_ns=scheduled_ns,
                          deadline_ns=scheduled_ns + self.config.deadline_ns, skipped=True,
                          plan_source="none", fallback_reason=reason, mode=self.config.mode,
                          command_id=command_id, command_arrival_ns=arrival_ns,
                          floor=self.floor)
        self._write(rec)

    def record_superseded(self, command: InboundCommand) -> None:
        """Record a command replaced by a newer one before its cycle could start (event mode):
        a skipped cycle, a miss, never a silent gap."""
        self._skipped(self._take_cycle_id(), command.start_ns, command.command_id,
                      reason="superseded", arrival_ns=command.arrival_ns)

    # --- driving loops ----------------------------------------------------------------------
    def submit(self, command: InboundCommand) -> None:
        """Hand a command to the loop (thread-safe; newest wins)."""
        self.mailbox.put(command)

    def run_periodic(self, n_cycles: int, *, start_ns: int | None = None,
                     feed: Callable[[int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> int:
        """Run ``n_cycles`` ticks (skipped ones included); return how many were recorded.

        ``feed(now_ns)`` is called before each cycle to deliver commands that have arrived by
        then (a replayed stream); live sources call :meth:`submit` from their own thread.
        """
        period = self.config.period_ns
        t0 = self.clock() if start_ns is None else start_ns
        n = 0
        while n < n_cycles and not (should_stop and should_stop()):
            scheduled = t0 + n * period
            self.wait_for_tick(scheduled)
            if feed is not None:
                feed(self.clock())
            newest = self.mailbox.take()
            if newest is not None:
                self._current = newest
            if self._current is not None and is_withdrawn(self.withdrawals, self._current) \
                    and self._current.command_id == self._last_command_id:
                self._current = None  # withdrawn after its cycles: no longer re-planned
            self.run_cycle(self._take_cycle_id(), scheduled, self._current)
            n += 1
            # Ticks whose deadline passed while this cycle overran are misses, not gaps.
            now = self.clock()
            while n < n_cycles and t0 + n * period + self.config.deadline_ns <= now:
                self._skipped(self._take_cycle_id(), t0 + n * period)
                n += 1
        return n

    def wait_for_tick(self, tick_ns: int) -> None:
        """Periodic mode: wait until ``tick_ns``; a stamped command (its deadline counts from
        its send) whose give-up time comes first gets a cycle of its own then (the fallback,
        reason ``deadline``): at the tick its plan could arrive late. The tick re-plans it.
        Looks every :data:`TICK_POLL_NS` (a replay's ``feed`` delivers at the ticks)."""
        while (now := self.clock()) < tick_ns:
            waiting, wake = self.mailbox.peek(), tick_ns
            if waiting is not None and waiting.sent_ns is not None \
                    and waiting.command_id != self._last_command_id:
                wake = waiting.start_ns + waiting.budget_ns(self.config.deadline_ns) - (
                    self.publish_margin.margin_ns() + self.transport.margin_ns())
                if wake <= now and (taken := self.mailbox.take()) is not None:
                    self._current = taken  # the newest (newer than the peek's in a race)
                    self.run_cycle(self._take_cycle_id(), taken.start_ns, taken)
                    continue
            self.sleep_until(min(wake, tick_ns, now + TICK_POLL_NS))

    def _take_cycle_id(self) -> int:
        cycle = self.next_cycle
        self.next_cycle += 1
        return cycle

    def run_events(self, commands: Iterable[InboundCommand], *,
                   should_stop: Callable[[], bool] | None = None) -> int:
        """Event mode: each command (announced: :meth:`Mailbox.announce`) starts a cycle at its
        arrival, in arrival order. One whose deadline passed while it waited for the loop is
        recorded as a skipped miss; one already past it when it arrived (a stamp older than the
        deadline) keeps its lateness: answered at once (the fallback), recorded as missed. With
        ``on_new_command: preempt``, a command that arrives while the model works on the
        previous one aborts that generation (the previous command is recorded as superseded):
        for a list of commands the loop sees the next arrival time itself; a live source (an
        iterator) sets :attr:`newer_command_waiting`. Returns the number of cycles recorded.
        """
        n = 0
        listed = list(commands) if isinstance(commands, (list, tuple)) else None
        own_interrupt = (listed is not None and self.config.on_new_command == "preempt"
                         and self.newer_command_waiting is None)
        for i, command in enumerate(listed if listed is not None else commands):
            if should_stop is not None and should_stop():
                break
            if own_interrupt:
                assert listed is not None
                nxt = listed[i + 1].arrival_ns if i + 1 < len(listed) else None
                self.newer_command_waiting = (
                    None if nxt is None else (lambda at=nxt: self.clock() >= at))
            self.mailbox.announce(command)
            self.sleep_until(command.arrival_ns)
            expires_ns = command.start_ns + command.budget_ns(self.config.deadline_ns)
            if command.arrival_ns < expires_ns <= self.clock():
                self._skipped(self._take_cycle_id(), command.start_ns, command.command_id,
                              arrival_ns=command.arrival_ns)
            else:
                self.run_cycle(self._take_cycle_id(), command.start_ns, command)
            n += 1
        if own_interrupt:
            self.newer_command_waiting = None
        return n
