"""The messages between a loader and its workers, and the wire form of an outcome.

Each worker has two socket pairs:

- *commands* (loader → worker), a stream socket: frames of a 4-byte length
  and a pickled tuple whose first field is a :class:`Command`.
- *results* (worker → loader), a ``SOCK_SEQPACKET`` socket: one fixed
  :data:`RESULT` header per message, plus the descriptor of the result's
  shared-memory segment the first time the loader sees that segment (the
  payload itself is in the segment, see :mod:`aioload.memory.segments`). Message
  boundaries are kept, so a descriptor always arrives with its own header.

What crosses a process or pickle boundary for one batch — a worker process's
result segment, an executor task's return value — is the wire form of its
:class:`~aioload.backends.base.Outcome` (:func:`outcome_to_wire`): the bare
batch when that is all there is to say (the common case costs nothing
extra), else a :class:`WireOutcome`, whose error travels as an
:class:`ErrorReport` (pickled where it can be, always with its type, message,
notes and traceback as text). :func:`outcome_from_wire` makes the outcome again
on the loader's side, rebuilding the error.
"""

from __future__ import annotations

import enum
import os
import pickle
import socket
import struct
import traceback
from dataclasses import dataclass
from typing import Any

from aioload.errors import WorkerError
from aioload.faults.policy import SkippedItem
from aioload.memory.segments import Written
from aioload.read.outcome import Outcome
from aioload.stats.source_counts import SourceCounts

__all__ = [
    "FRAME_LENGTH",
    "ErrorReport",
    "WireOutcome",
    "outcome_from_wire",
    "outcome_to_wire",
    "RESULT",
    "Command",
    "Result",
    "command_frame",
    "receive_results",
    "result_socket_pair",
    "send_result",
]

FRAME_LENGTH = struct.Struct("<I")
RESULT = struct.Struct("<Bqqqqq")  # kind, epoch, seq, segment (-1: none), size, layout offset
NO_EPOCH = -1


class Command(enum.IntEnum):
    """What the loader asks of a worker."""

    FETCH = 1  # (FETCH, epoch, seq, keys): fetch and collate one batch of keys
    NEXT = 2  # (NEXT, epoch, seq): the next batch of the worker's stream
    END_EPOCH = 3  # (END_EPOCH,): stop the current epoch's work
    RECYCLE = 4  # (RECYCLE, recycle, drop): segments the loader no longer uses
    STOP = 5  # (STOP,): exit
    # (START_EPOCH, epoch, dataset_epochs, resume): sent to each worker before the epoch's
    # first request; dataset_epochs: what set_epoch gave the loader's dataset
    # (aioload.data.epochs), set on the worker's copy first; resume: the stream state
    # to load before the epoch's stream starts (checkpoints), or None
    START_EPOCH = 6


class Result(enum.IntEnum):
    """What a worker reports."""

    OUTCOME = 1  # the segment holds a batch's outcome in its wire form (outcome_to_wire)
    END = 3  # the worker's stream has no more batches (no segment)
    START_FAILED = 4  # the segment holds the ErrorReport that stopped the worker's start


def command_frame(*fields: Any) -> bytes:
    """One command, framed for the command socket."""
    data = pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME_LENGTH.pack(len(data)) + data


def result_socket_pair() -> tuple[socket.socket, socket.socket]:
    """The (loader end, worker end) of a result channel."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send_result(
    sock: socket.socket, kind: Result, epoch: int, seq: int, written: Written | None
) -> None:
    """Sends one result header (blocking), with the segment's descriptor when it is new."""
    if written is None:
        sock.send(RESULT.pack(kind, epoch, seq, -1, 0, 0))
        return
    header = RESULT.pack(kind, epoch, seq, written.segment, written.size, written.layout_at)
    if written.fd is None:
        sock.send(header)
        return
    try:
        socket.send_fds(sock, [header], [written.fd])
    finally:
        # The loader now holds its own copy of the descriptor; the mapping keeps ours alive.
        os.close(written.fd)


def receive_results(
    sock: socket.socket,
) -> tuple[list[tuple[int, int, int, int, int, int, int | None]], bool]:
    """Every result waiting on a non-blocking socket, and whether the worker closed it.

    Each result is ``(kind, epoch, seq, segment, size, layout_at, fd)``.
    """
    results: list[tuple[int, int, int, int, int, int, int | None]] = []
    while True:
        try:
            data, fds, _flags, _address = socket.recv_fds(sock, RESULT.size, 1)
        except BlockingIOError:
            return results, False
        except ConnectionError:
            return results, True
        if not data:
            return results, True
        results.append((*RESULT.unpack(data), fds[0] if fds else None))


@dataclass(frozen=True)
class ErrorReport:
    """An exception on its way out of a worker.

    ``error`` is the pickled exception (its notes included), or None when it
    cannot be pickled; the type's name, the message, the notes and the
    formatted traceback always cross, so :meth:`rebuild` can stand a
    :class:`~aioload.WorkerError` in for an error that does not unpickle.
    Any ``BaseException`` travels: a dataset's ``SystemExit`` or
    ``KeyboardInterrupt`` is raised in the loader as itself, and one that
    does not unpickle is rebuilt as its own type all the same (a
    ``WorkerError`` in its place would turn an exit into an ordinary error).
    """

    error: bytes | None
    type_name: str
    message: str
    traceback: str
    notes: tuple[str, ...] = ()

    @classmethod
    def of(cls, error: BaseException) -> ErrorReport:
        """Packs ``error`` (and its traceback, as text)."""
        text = "".join(traceback.format_exception(error))
        try:
            pickled: bytes | None = pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            pickled = None
        kind = type(error)
        notes = tuple(getattr(error, "__notes__", ()))
        return cls(pickled, f"{kind.__module__}.{kind.__qualname__}", str(error), text, notes)

    def rebuild(self, where: str | None = None) -> BaseException:
        """The exception again (or a WorkerError naming it), with notes on where it came from.

        ``where`` (``"DataLoader worker 1 (pid 123)"``) becomes a note
        ``raised in …``; the worker's traceback is always added as a note.
        """
        error: BaseException | None = None
        if self.error is not None:
            try:
                error = pickle.loads(self.error)
            except Exception:
                error = None
        if not isinstance(error, BaseException):
            error = self._stand_in()
            for note in self.notes:
                error.add_note(note)
        elif isinstance(error, SystemExit) and error.code is None and error.args:
            # Rebuilt without its __init__ (tblib's pickling, which dask installs, does
            # that): the exit status is in args, as SystemExit.__init__ would have put it.
            status: Any = error.args[0] if len(error.args) == 1 else error.args
            error.code = status
        if where is not None:
            error.add_note(f"raised in {where}")
        error.add_note(f"worker traceback:\n{self.traceback.rstrip()}")
        return error

    def _stand_in(self) -> BaseException:
        """What is raised for an error that did not unpickle."""
        if self.type_name == "builtins.KeyboardInterrupt":
            return KeyboardInterrupt(self.message)
        if self.type_name == "builtins.SystemExit":
            # str(SystemExit(3)) is "3": an exit status stays a number.
            message = self.message
            return SystemExit(int(message) if message.lstrip("-").isdigit() else message)
        return WorkerError(f"{self.type_name}: {self.message}")


@dataclass(frozen=True, slots=True)
class WireOutcome:
    """An :class:`~aioload.backends.base.Outcome` that says more than its batch.

    ``error`` is an :class:`ErrorReport`, or the exception itself where
    nothing is pickled (a thread pool in the loader's process). The sequence
    number and the worker travel beside it (in the message header, or known
    to whoever awaits the task).
    """

    batch: Any = None
    error: ErrorReport | BaseException | None = None
    skipped: tuple[SkippedItem, ...] = ()
    retries: int = 0
    stream_state: Any = None
    empty: bool = False
    end: bool = False
    counts: SourceCounts | None = None
    concurrency: int | None = None
    throttles: int = 0


def outcome_to_wire(outcome: Outcome, *, pickled: bool = True) -> Any:
    """The wire form of ``outcome``: its bare batch when nothing else is to be said.

    ``pickled``: the form will be pickled, so an error goes as an
    :class:`ErrorReport` (False keeps the exception object).
    """
    error = outcome.error
    if (
        error is None
        and not outcome.skipped
        and not outcome.retries
        and outcome.stream_state is None
        and not outcome.empty
        and not outcome.end
        and outcome.counts is None
        and outcome.concurrency is None
        and not outcome.throttles
    ):
        return outcome.batch
    return WireOutcome(
        outcome.batch,
        ErrorReport.of(error) if pickled and error is not None else error,
        outcome.skipped,
        outcome.retries,
        outcome.stream_state,
        outcome.empty,
        outcome.end,
        outcome.counts,
        outcome.concurrency,
        outcome.throttles,
    )


def outcome_from_wire(
    payload: Any, seq: int, *, worker: int | None = None, where: str | None = None
) -> Outcome:
    """The outcome of batch ``seq`` from its wire form (see :meth:`ErrorReport.rebuild`)."""
    if type(payload) is not WireOutcome:
        return Outcome(seq, payload, worker=worker)
    error = payload.error
    if isinstance(error, ErrorReport):
        error = error.rebuild(where)
    return Outcome(
        seq,
        payload.batch,
        error,
        payload.skipped,
        payload.retries,
        payload.stream_state,
        worker,
        payload.empty,
        payload.end,
        payload.counts,
        payload.concurrency,
        payload.throttles,
    )
