"""A progress bar for long iterations: ``for batch in aioload.progress(loader)``.

(The module is ``progressbar`` so that it does not shadow the function.)

A thin wrapper around tqdm (the optional extra ``aioload-data[progress]``): the bar
counts batches against ``len(loader)`` and shows, in its postfix, the items
per second and the share of the time the consumer spent waiting for data
(``stall``, from :meth:`DataLoader.stats() <aioload.DataLoader.stats>`). The
postfix is refreshed at most twice a second, so the bar costs a clock read
and tqdm's own update per batch. Nothing shows a bar unless asked: a loader
never does by itself.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

__all__ = ["ProgressBar", "progress"]

POSTFIX_INTERVAL = 0.5
"""Seconds between two refreshes of the bar's items/s and stall figures."""


def _tqdm_class() -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError as error:
        raise ImportError(
            "aioload.progress needs tqdm, which is not installed: "
            "pip install 'aioload-data[progress]'"
        ) from error
    return tqdm


def _postfix(loader: Any) -> str | None:
    stats = getattr(loader, "stats", None)
    if not callable(stats):
        return None
    epoch = stats().epoch
    return f"{_si(epoch.items_per_s)} items/s, stall {epoch.stall_fraction:.0%}"


def _si(value: float) -> str:
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


class ProgressBar:
    """Iterates ``loader`` (with ``for`` or ``async for``) behind a tqdm progress bar.

    Made by :func:`progress`; each iteration draws a new bar, closed when the
    iteration ends, is broken out of, or fails.

    Args:
        loader: a :class:`~aioload.DataLoader` (or any iterable / async
            iterable; the items/s and stall figures need a ``stats()``).
        tqdm_kwargs: passed to ``tqdm`` (``desc``, ``leave``, ``file``,
            ``position``, ``disable``, ...); ``tqdm_class`` picks another bar
            class (default ``tqdm.auto.tqdm``: a widget in notebooks).
    """

    def __init__(self, loader: Any, **tqdm_kwargs: Any) -> None:
        tqdm_class = tqdm_kwargs.pop("tqdm_class", None)
        self._tqdm = tqdm_class if tqdm_class is not None else _tqdm_class()
        self.loader = loader
        self._kwargs = tqdm_kwargs

    def __len__(self) -> int:
        return len(self.loader)

    def _bar(self) -> Any:
        kwargs = dict(self._kwargs)
        if "total" not in kwargs:
            try:
                kwargs["total"] = len(self.loader)
            except TypeError:  # an iterable dataset without a length
                kwargs["total"] = None
        kwargs.setdefault("unit", "batch")
        kwargs.setdefault("dynamic_ncols", True)
        return self._tqdm(**kwargs)

    def __iter__(self) -> Iterator[Any]:
        loader = self.loader
        iterator = iter(loader)
        bar = None
        try:
            bar = self._bar()
            refresh = time.monotonic() + POSTFIX_INTERVAL
            for batch in iterator:
                bar.update(1)
                now = time.monotonic()
                if now >= refresh:
                    refresh = now + POSTFIX_INTERVAL
                    _set_postfix(bar, loader)
                yield batch
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()  # the loader's epoch ends now, also on break or error
            if bar is not None:
                _set_postfix(bar, loader)
                bar.close()

    def __aiter__(self) -> AsyncIterator[Any]:
        return _AsyncProgress(self._bar(), self.loader)


def _set_postfix(bar: Any, loader: Any) -> None:
    postfix = _postfix(loader)
    if postfix is not None:
        bar.set_postfix_str(postfix, refresh=False)


class _AsyncProgress:
    """The ``async for`` side of :class:`ProgressBar`: one bar, one iteration."""

    def __init__(self, bar: Any, loader: Any) -> None:
        self._bar = bar
        self._loader = loader
        self._iterator = aiter(loader)
        self._refresh = time.monotonic() + POSTFIX_INTERVAL
        self._closed = False

    def __aiter__(self) -> _AsyncProgress:
        return self

    async def __anext__(self) -> Any:
        try:
            batch = await anext(self._iterator)
        except BaseException:  # the end, an error, or a cancellation: the bar is done
            self._close_bar()
            raise
        bar = self._bar
        bar.update(1)
        now = time.monotonic()
        if now >= self._refresh:
            self._refresh = now + POSTFIX_INTERVAL
            _set_postfix(bar, self._loader)
        return batch

    async def aclose(self) -> None:
        """Stops the loader's iteration and closes the bar."""
        try:
            close = getattr(self._iterator, "aclose", None)
            if close is not None:
                await close()
        finally:
            self._close_bar()

    def _close_bar(self) -> None:
        if not self._closed:
            self._closed = True
            _set_postfix(self._bar, self._loader)
            self._bar.close()

    def __del__(self) -> None:
        # Dropped after a break without aclose(): the loader's iterator stops itself.
        if not getattr(self, "_closed", True):
            self._closed = True
            self._bar.close()


def progress(loader: Iterable[Any] | Any, **tqdm_kwargs: Any) -> ProgressBar:
    """Wraps ``loader`` in a tqdm progress bar showing items/s and consumer stall.

    Works with ``for`` and ``async for``. The bar counts batches (against
    ``len(loader)`` when the loader has a length); its postfix shows the
    latest epoch's items per second and ``stall``: the share of the time the
    consumer waited for data (near 0%: the model sets the pace; high: the
    input pipeline does). Needs tqdm: ``pip install 'aioload-data[progress]'``.

    Args:
        loader: the :class:`~aioload.DataLoader` to iterate.
        tqdm_kwargs: passed to ``tqdm`` (``desc``, ``leave``, ``file``,
            ``position``, ``disable``, ...); ``tqdm_class`` picks another bar
            class (default ``tqdm.auto.tqdm``).

    Raises:
        ImportError: tqdm is not installed.

    Example::

        >>> import numpy as np
        >>> import tqdm   # pip install 'aioload-data[progress]'
        >>> import aioload
        >>> dataset = aioload.ArrayDataset(np.zeros((1000, 8), np.float32), np.arange(1000))
        >>> loader = aioload.DataLoader(dataset, batch_size=64)
        >>> for epoch in range(3):
        ...     for x, y in aioload.progress(loader, desc=f"epoch {epoch}"):
        ...         pass   # a training step
        >>> # each epoch's bar, on stderr; at the end of a training run's first epoch:
        >>> # epoch 0: 100%|█████| 1563/1563 [00:41<00:00, 37.9batch/s, 2.42k items/s, stall 3%]
        >>> # inside a coroutine: async for batch in aioload.progress(loader): ...
    """
    return ProgressBar(loader, **tqdm_kwargs)
