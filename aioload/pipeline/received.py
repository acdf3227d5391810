"""What the consumer of one epoch has received: the record a checkpoint is made from.

The consumer's iterator reports every batch it takes out (:meth:`Received.receive`,
on the consumer's thread, so it costs a field update or two); the scheduler reports
batches that deliver nothing; :class:`~aioload.pipeline.checkpoint.Checkpoints` reads the
record when asked for a state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Received"]


class Received:
    """Which batches of one epoch the consumer has received (for checkpoints).

    ``done``: every batch numbered below it was received (or had nothing to
    deliver); ``extra``: batches numbered past ``done`` that were received
    out of order (``in_order=False``; at most a window's worth). A resumed
    epoch starts at ``done`` and does not fetch the batches in ``skip``.

    :meth:`receive` runs on the consumer's thread once per batch, so it is a
    field update or two. Batches that deliver nothing (every item skipped
    under ``on_error='skip'``) are reported from the loop through
    :meth:`nothing_for` into a deque, which the consumer's thread drains.

    For an iterable dataset with ``state_dict``, ``stream_states`` maps a
    batch to ``(worker, state)``: the worker that read it (None without
    workers) and its dataset's state just after the batch was read (the stream
    reads ahead of the consumer). ``stream_state`` is the state as of the last
    batch received; with workers, ``{"workers": [state per worker],
    "next_worker": the worker whose turn comes next}``.

    Args:
        in_order: the epoch delivers in sequence order.
        done: the first batch of a resumed epoch (0 for a fresh one).
        received: batches past ``done`` the interrupted run had received.
        stream: track an iterable dataset's states.
        stream_state: the dataset's state as of ``done`` (resumed epochs).
    """

    def __init__(
        self,
        in_order: bool = True,
        done: int = 0,
        received: Iterable[int] = (),
        *,
        stream: bool = False,
        stream_state: Any = None,
    ) -> None:
        self.done = done
        self.extra: set[int] = set(received)
        self.skip = frozenset(self.extra)
        self.finished = False  # the consumer received the end of a successful epoch
        self.stream_states: dict[int, Any] | None = {} if stream else None
        self.stream_state = stream_state
        self._nothing: deque[int] = deque()
        self.receive: Callable[[int], None]
        if stream:
            self.receive = self._receive_stream
        elif in_order:
            self.receive = self._receive_in_order
        else:
            self.receive = self._receive_any

    def _receive_in_order(self, seq: int) -> None:
        # In order, receiving ``seq`` means every batch before it went out or had nothing.
        self.done = seq + 1

    def _receive_stream(self, seq: int) -> None:
        self.done = seq + 1
        states = self.stream_states
        if not states:
            return
        recorded = states.pop(seq, None)
        if recorded is None:
            return
        worker, state = recorded
        if worker is None:
            self.stream_state = state
        else:
            # Each worker streams its own copy, and the consumer receives each
            # worker's batches in the order it read them: its latest state counts.
            workers = self.stream_state["workers"]
            workers[worker] = state
            self.stream_state["next_worker"] = (worker + 1) % len(workers)
        # States of the same stream's earlier batches that delivered nothing.
        for old in [old for old, (w, _) in states.items() if old < seq and w == worker]:
            del states[old]

    def _receive_any(self, seq: int) -> None:
        if self._nothing:
            self._settle()
        if seq == self.done:
            self._advance(seq + 1)
        elif seq > self.done:
            self.extra.add(seq)

    def _advance(self, done: int) -> None:
        extra = self.extra
        while done in extra:
            extra.discard(done)
            done += 1
        self.done = done

    def _settle(self) -> None:
        """Counts the batches that had nothing to deliver as received (consumer's thread)."""
        nothing = self._nothing
        while nothing:
            seq = nothing.popleft()
            if seq == self.done:
                self._advance(seq + 1)
            elif seq > self.done:
                self.extra.add(seq)

    def nothing_for(self, seq: int) -> None:
        """Batch ``seq`` completed with nothing to deliver (call on the loop)."""
        if self.stream_states is None:  # a stream's empty batches are past its end
            self._nothing.append(seq)

    def position(self) -> tuple[int, list[int]]:
        """``done`` and the sorted batches past it already received (consumer's thread)."""
        self._settle()
        return self.done, sorted(self.extra)
