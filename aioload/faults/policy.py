"""The per-item fault policy: retries with backoff, item timeouts, skipping bad items.

A loader's default is torch's: the first error of an item fails its batch. The
policy changes that per item (:class:`FaultPolicy`, built from the loader's
``retry``, ``item_timeout``, ``on_error`` and ``max_skipped`` arguments):

- an attempt that raises an error ``retry.retry_on`` accepts (a *transient*
  error) is tried again after an exponential backoff with jitter, up to
  ``retry.attempts`` attempts in all;
- an attempt slower than ``item_timeout`` fails with :class:`ItemTimeoutError`
  (a ``TimeoutError``, so transient under the default ``retry_on``);
- an item that still fails — a non-transient error, or its attempts used up —
  either fails its batch with its own exception (``on_error='raise'``) or is
  dropped from its batch and recorded as a :class:`SkippedItem`
  (``on_error='skip'``);
- past ``max_skipped`` skips in an epoch the epoch ends with
  :class:`TooManySkippedError`, which lists every skipped key and reason.

The policy runs where the items are read, through one retry loop per reader
(:class:`~aioload.faults.retrier.Retrier`): on the loader's loop, or inside each
worker process; skip records travel back with their batch and are counted by
the epoch in the loader (:class:`SkipLog`). A stream applies it itself, when it
can skip a sample without ending (see :mod:`aioload.faults.guard`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aioload.checks import is_int, is_real
from aioload.errors import ItemTimeoutError, TooManySkippedError

__all__ = [
    "FaultPolicy",
    "ItemTimeoutError",
    "RetryPolicy",
    "Skip",
    "SkipLog",
    "SkippedItem",
    "TooManySkippedError",
]

logger = logging.getLogger("aioload")

ON_ERROR_CHOICES = ("raise", "skip")


def _exception_types(retry_on: Any) -> tuple[type[Exception], ...] | None:
    """``retry_on`` as a tuple of exception types, or None when it is not one."""
    candidates = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if all(isinstance(kind, type) and issubclass(kind, Exception) for kind in candidates):
        return candidates
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """How failed item reads are retried: how often, how long to wait, and for which errors.

    Attempt ``n + 1`` (after ``n`` failures) waits ``min(max_backoff, backoff
    * 2 ** (n - 1))`` seconds first; with ``jitter`` a random amount between
    half of that and all of it, so items that failed together do not come back
    together.

    Args:
        attempts: attempts in all, the first one included (1: no retries).
        backoff: seconds before the first retry (0: retry at once).
        max_backoff: the longest wait between two attempts.
        jitter: randomize each wait between half and all of it.
        retry_on: which errors are transient (worth another attempt): an
            exception class, a tuple of them, or a predicate
            ``retry_on(error) -> bool``. The default retries ``OSError``
            (connections, I/O, and so ``FileNotFoundError`` too: narrow it to
            ``(ConnectionError, TimeoutError)`` if missing files are final for
            you) and ``TimeoutError`` (a timed-out attempt included). With
            worker processes the predicate is pickled: make it a module-level
            function.

    Example::

        >>> policy = RetryPolicy(attempts=4, backoff=0.05, retry_on=ConnectionError)
        >>> policy.retries(ConnectionResetError()), policy.retries(KeyError(3))
        (True, False)
        >>> RetryPolicy(backoff=0.1, jitter=False).delay(3)
        0.4
    """

    attempts: int = 3
    backoff: float = 0.1
    max_backoff: float = 10.0
    jitter: bool = True
    retry_on: tuple[type[Exception], ...] | Callable[[BaseException], bool] = (
        OSError,
        TimeoutError,
    )

    def __post_init__(self) -> None:
        if not is_int(self.attempts) or self.attempts < 1:
            raise ValueError(
                "RetryPolicy.attempts should be a positive integer (attempts in all, "
                f"the first one included; 1 means no retries); got {self.attempts!r}"
            )
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if not is_real(value) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"RetryPolicy.{name} should be a finite number of seconds >= 0; got {value!r}"
                )
        if self.max_backoff < self.backoff:
            raise ValueError(
                f"RetryPolicy.max_backoff ({self.max_backoff!r}) should be at least "
                f"backoff ({self.backoff!r}): it caps the growing waits"
            )
        if not isinstance(self.jitter, bool):
            raise TypeError(f"RetryPolicy.jitter should be a bool; got {self.jitter!r}")
        types = _exception_types(self.retry_on)
        if types is not None:
            if not types:
                raise ValueError(
                    "RetryPolicy.retry_on is an empty tuple: no error would ever be retried "
                    "(use retry=None for no retries)"
                )
            object.__setattr__(self, "retry_on", types)
        elif isinstance(self.retry_on, tuple | type) or not callable(self.retry_on):
            raise TypeError(
                "RetryPolicy.retry_on should be an Exception subclass, a tuple of them, or "
                f"a predicate taking the error and returning a bool; got {self.retry_on!r}"
            )

    def retries(self, error: BaseException) -> bool:
        """Whether ``error`` is transient, i.e. worth another attempt."""
        retry_on = self.retry_on
        if isinstance(retry_on, tuple):
            return isinstance(error, retry_on)
        return bool(retry_on(error))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the ``attempt``-th failed attempt (1-based).

        ``rng`` draws the jitter (default: the ``random`` module's generator).
        """
        wait = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        if self.jitter:
            wait *= 0.5 + 0.5 * (rng or random).random()
        return wait


@dataclass(frozen=True)
class SkippedItem:
    """One item an epoch gave up on (``on_error='skip'``), and why.

    Attributes:
        key: the item's key.
        error_type: the qualified name of the last error's type.
        error: the last error's message.
        attempts: how many attempts were made.
        worker: the worker process that read it (None: the loader's own loop).
        where: where a stream met it, when the stream says (a shard's URL and
            the byte offset of the sample; see :mod:`aioload.faults.guard`).

    ``str(item)`` reads like ``key 7: builtins.KeyError: 'missing' (1 attempt)``, or
    ``key '000017' (s3://b/train-3.tar, byte 10240): ...`` with a ``where``.
    """

    key: Any
    error_type: str
    error: str
    attempts: int
    worker: int | None = None
    where: str | None = None

    @classmethod
    def from_error(
        cls,
        key: Any,
        error: BaseException,
        attempts: int,
        worker: int | None = None,
        where: str | None = None,
    ) -> SkippedItem:
        """The record of ``key``, given up after ``attempts`` attempts (the last raised it)."""
        kind = type(error)
        name = f"{kind.__module__}.{kind.__qualname__}"
        return cls(key, name, str(error), attempts, worker, where)

    @property
    def reason(self) -> str:
        """``error_type: error``."""
        return f"{self.error_type}: {self.error}"

    def __str__(self) -> str:
        worker = "" if self.worker is None else f", worker {self.worker}"
        plural = "" if self.attempts == 1 else "s"
        where = "" if self.where is None else f" ({self.where})"
        return f"key {self.key!r}{where}: {self.reason} ({self.attempts} attempt{plural}{worker})"


class Skip:
    """A marker that stands in a result list, or a stream, where ``on_error='skip'`` gave an
    item up; the reader drops it from the batch and keeps its :class:`SkippedItem`.

    Args:
        record: what was skipped, and why.

    Example::

        >>> marker = Skip(SkippedItem.from_error(7, KeyError("missing"), attempts=1))
        >>> print(marker.record)
        key 7: builtins.KeyError: 'missing' (1 attempt)
    """

    __slots__ = ("record",)

    def __init__(self, record: SkippedItem) -> None:
        self.record = record


@dataclass(frozen=True)
class FaultPolicy:
    """What a loader does when an item fails (see the module docstring).

    Built by the loader from its arguments of the same names, which it
    validates here (errors name the loader's arguments).

    Args:
        retry: how transient failures are retried; None: never.
        item_timeout: seconds one attempt at one item may take; None: no limit.
        on_error: ``'raise'`` (fail the batch) or ``'skip'`` (drop the item).
        max_skipped: with ``'skip'``, the most items one epoch may skip: a
            count (int >= 0) or a fraction of the epoch's items (a float
            strictly between 0 and 1); None: no limit.

    Example::

        >>> FaultPolicy().active
        False
        >>> FaultPolicy(on_error="skip", max_skipped=0.01).skip_limit(1000)
        10
    """

    retry: RetryPolicy | None = None
    item_timeout: float | None = None
    on_error: Literal["raise", "skip"] = "raise"
    max_skipped: int | float | None = None

    def __post_init__(self) -> None:
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise TypeError(
                "retry should be a RetryPolicy (e.g. RetryPolicy(attempts=3, backoff=0.1)) "
                f"or None; got {self.retry!r}"
            )
        timeout = self.item_timeout
        if timeout is not None and (
            not is_real(timeout) or not math.isfinite(timeout) or timeout <= 0
        ):
            raise ValueError(
                f"item_timeout should be a positive number of seconds or None; got {timeout!r}"
            )
        if self.on_error not in ON_ERROR_CHOICES:
            raise ValueError(
                f"on_error should be 'raise' (fail the batch, the default) or 'skip' (drop "
                f"the item from its batch); got {self.on_error!r}"
            )
        limit = self.max_skipped
        if limit is None:
            return
        if self.on_error != "skip":
            raise ValueError(
                f"max_skipped={limit!r} needs on_error='skip' (with on_error='raise' nothing "
                "is skipped)"
            )
        if is_int(limit):
            if limit < 0:
                raise ValueError(f"max_skipped should be a count >= 0 or a fraction; got {limit}")
        elif isinstance(limit, float):
            if not 0.0 < limit < 1.0:
                raise ValueError(
                    "max_skipped as a float is a fraction of the epoch's items and should be "
                    f"strictly between 0 and 1 (use an int for a count); got {limit!r}"
                )
        else:
            raise TypeError(
                "max_skipped should be None, a count (int >= 0) or a fraction of the epoch "
                f"(a float between 0 and 1); got {limit!r}"
            )

    @property
    def active(self) -> bool:
        """Whether reads need guarding at all (False for the default, torch's behaviour)."""
        return self.retry is not None or self.item_timeout is not None or self.on_error == "skip"

    def skip_limit(self, items: int | None) -> int | None:
        """The most skips an epoch of ``items`` items allows (None: no limit).

        A fraction needs ``items``; it rounds down.
        """
        limit = self.max_skipped
        if limit is None or is_int(limit):
            return limit
        if items is None:
            raise ValueError(
                f"max_skipped={limit!r} is a fraction of the epoch, whose length is unknown"
            )
        # The epsilon keeps 0.29 * 100 (28.999999999999996 in binary) at 29.
        return math.floor(limit * items + 1e-9)


class SkipLog:
    """The items one epoch skipped; logs each once and enforces ``max_skipped``.

    Lives in the loader's process (skips from workers come back with their
    batch); :attr:`DataLoader.skipped <aioload.DataLoader.skipped>` reads it.

    Args:
        limit: the most skips allowed (None: no limit).
        max_skipped: the loader's argument, for messages.
    """

    def __init__(self, limit: int | None, max_skipped: int | float | None) -> None:
        self.limit = limit
        self._max_skipped = max_skipped
        self._items: list[SkippedItem] = []

    @property
    def items(self) -> list[SkippedItem]:
        """A copy of the records so far, in the order they arrived."""
        return list(self._items)

    def record(self, seq: int, skipped: Sequence[SkippedItem]) -> TooManySkippedError | None:
        """Adds batch ``seq``'s skips; the error to end the epoch with once past the limit."""
        items = self._items
        for item in skipped:
            items.append(item)
            logger.warning("DataLoader skipped an item of batch %d: %s", seq, item)
        if self.limit is None or len(items) <= self.limit:
            return None
        allowed = (
            f"max_skipped={self._max_skipped!r}"
            if self._max_skipped == self.limit
            else f"max_skipped={self._max_skipped!r}, i.e. {self.limit} items"
        )
        listing = "\n".join(f"  {item}" for item in items)
        return TooManySkippedError(
            f"the epoch skipped {len(items)} items, more than {allowed} (the limit was "
            f"crossed in batch {seq}); the epoch stopped. Skipped:\n{listing}",
            skipped=items,
            limit=self.limit,
        )
