"""The bounded command mailbox between command sources and the planner loop: newest wins."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InboundCommand:
    """A command as it arrived: its id, text and arrival time (ns, the loop's clock), the robot
    state text that came with it (None: the loop's latest state, if any), when its sender
    sent it, on the loop's clock (None: not known), and the deadline its sender asked for (ns;
    None: the loop's; the loop never takes longer than its own)."""

    command_id: str
    text: str
    arrival_ns: int
    state: str | None = None
    sent_ns: int | None = None
    deadline_ns: int | None = None

    def budget_ns(self, loop_deadline_ns: int) -> int:
        """Its cycle's deadline budget (ns): its own when shorter than the loop's."""
        own = self.deadline_ns
        return loop_deadline_ns if not own else min(own, loop_deadline_ns)

    @property
    def start_ns(self) -> int:
        """When the command's deadline starts counting (event mode): its send, where the sender
        stamped it on this clock (the receiver's deadline counts from there), else its
        arrival."""
        return self.arrival_ns if self.sent_ns is None else min(self.sent_ns, self.arrival_ns)

    @property
    def stamp_ns(self) -> int:
        """When the command was taken, the stamp a plan answering it carries: its send where
        the sender stamped it on this clock, else its arrival."""
        return self.arrival_ns if self.sent_ns is None else self.sent_ns


class Mailbox:
    """A bounded, thread-safe mailbox where the newest command wins.

    ``put`` never blocks: when full, the oldest waiting command is dropped and counted. ``take``
    returns the newest command and discards the older ones still waiting (counted as
    superseded): a planner that fell behind plans for what the operator said last, not first.
    Memory stays bounded whatever the arrival rate.
    """

    def __init__(self, capacity: int = 16) -> None:
        if capacity < 1:
            raise ValueError(f"mailbox capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: collections.deque[InboundCommand] = collections.deque()
        self._lock = threading.Lock()
        self.received = 0
        self.dropped = 0      # pushed out by a full mailbox
        self.superseded = 0   # replaced by a newer command before the loop took it
        #: called with each command put, after it is in the mailbox (run.mcap's command channel)
        self.on_put: Callable[[InboundCommand], None] | None = None

    def put(self, command: InboundCommand) -> None:
        """Add a command; if full, drop the oldest waiting one (counted and logged)."""
        with self._lock:
            self.received += 1
            if len(self._items) >= self.capacity:
                old = self._items.popleft()
                self.dropped += 1
                log.debug("mailbox full (%d): dropped command %s", self.capacity, old.command_id)
            self._items.append(command)
        self.announce(command)

    def announce(self, command: InboundCommand) -> None:
        """Tell the observer (:attr:`on_put`) of a command; the loop announces the commands it
        takes from elsewhere (event mode). A command announced twice is the observer's to
        recognise (its id and arrival)."""
        if self.on_put is not None:
            self.on_put(command)

    def peek(self) -> InboundCommand | None:
        """Return the newest waiting command without taking it, or None if empty."""
        with self._lock:
            return self._items[-1] if self._items else None

    def take(self) -> InboundCommand | None:
        """Return the newest waiting command (older ones are superseded), or None if empty."""
        with self._lock:
            if not self._items:
                return None
            newest = self._items.pop()
            self.superseded += len(self._items)
            self._items.clear()
            return newest

    def take_all(self) -> list[InboundCommand]:
        """Return every waiting command, oldest first, and empty the mailbox.

        All but the newest count as superseded: the caller answers the newest and records the
        others as skipped cycles (event mode), so none of them silently disappears.
        """
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self.superseded += max(0, len(items) - 1)
            return items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def counters(self) -> dict[str, int]:
        """Return received, dropped and superseded counts."""
        with self._lock:
            return {"received": self.received, "dropped": self.dropped,
                    "superseded": self.superseded}


class Withdrawals(Protocol):
    """Commands their sender can withdraw (a ROS action goal's cancel), as the loop asks."""

    def tracks(self, command_id: str) -> bool:
        """Whether ``command_id`` can be withdrawn at all (its generation is then watched)."""
        ...

    def is_withdrawn(self, command_id: str) -> bool:
        """Whether the sender no longer wants a plan for ``command_id`` (thread-safe)."""
        ...

    def dropped(self, command_id: str) -> None:
        """Told (from the loop's thread) when the loop gave a withdrawn command up: nothing is
        published for it, its cycle is recorded as ``cancelled``."""
        ...


def is_withdrawn(withdrawals: Withdrawals | None, command: InboundCommand | None) -> bool:
    """Whether ``command``'s sender withdrew it (False without a command or withdrawals)."""
    return (command is not None and withdrawals is not None
            and withdrawals.is_withdrawn(command.command_id))


def withdrawal_interrupt(withdrawals: Withdrawals | None, command_id: str | None,
                         newer: Callable[[], bool] | None) -> Callable[[], bool] | None:
    """The loop's interrupt for one generation: ``newer`` (a newer command waits), and also the
    command's withdrawal where it can be withdrawn."""
    if withdrawals is None or command_id is None or not withdrawals.tracks(command_id):
        return newer

    def interrupt() -> bool:  # a withdrawn command's generation is aborted too
        return withdrawals.is_withdrawn(command_id) or (newer is not None and newer())

    return interrupt
