"""The messages between a loader and its worker processes.

Each worker has two socket pairs:

- *commands* (loader → worker), a stream socket: frames of a 4-byte length
  and a pickled tuple whose first field is a :class:`Command`.
- *results* (worker → loader), a ``SOCK_SEQPACKET`` socket: one fixed
  :data:`RESULT` header per message, plus the descriptor of the result's
  shared-memory segment the first time the loader sees that segment (the
  payload itself is in the segment, see :mod:`aioload.transport`). Message
  boundaries are kept, so a descriptor always arrives with its own header.
"""

from __future__ import annotations

import enum
import os
import pickle
import socket
import struct
from typing import Any

from aioload.transport import Written

__all__ = [
    "FRAME_LENGTH",
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
    NEXT = 2  # (NEXT, epoch, seq, resume): the next batch of the worker's stream; resume:
    # the dataset state to load before the epoch's stream starts (checkpoints), or None
    END_EPOCH = 3  # (END_EPOCH,): stop the current epoch's work
    RECYCLE = 4  # (RECYCLE, recycle, drop): segments the loader no longer uses
    STOP = 5  # (STOP,): exit


class Result(enum.IntEnum):
    """What a worker reports."""

    BATCH = 1  # the segment holds the batch
    ERROR = 2  # the segment holds the error (see aioload.worker.ErrorReport)
    EXHAUSTED = 3  # the worker's stream has no more batches
    START_FAILED = 4  # the segment holds the error that stopped the worker's start


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
