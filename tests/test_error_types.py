"""What a dataset or a sampler raises reaches the consumer as itself, on every route.

- Never as an ``ExceptionGroup``: a stream that cannot be opened (its
  ``__iter__``/``__aiter__`` raised) and anything that fails an epoch's task
  group (a sampler's ``SystemExit``) arrive as the original exception, from
  the inline backend (sync and async datasets), worker processes and the
  executor backend, under ``for`` and ``async for``.
- ``SystemExit`` and ``KeyboardInterrupt`` raised by ``__getitem__`` are the
  batch's error like any other: the consumer gets the same type (an exit
  keeps its code) with the note naming the batch and its keys, the iteration
  may go on, and a worker that read it is not restarted (it did not die).

Datasets live at module level: workers start with ``forkserver``, which pickles them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import aioload
from aioload import DataLoader, WorkerError
from aioload.backends.processes.wire import ErrorReport
from aioload.groups import ungroup
from aioload.pipeline.handoff import END, Delivery, LoopOutput
from aioload.pipeline.scheduler import Epoch
from aioload.settings import LoaderSettings

# -- datasets --------------------------------------------------------------------------


class CannotOpen(aioload.IterableDataset[int]):
    """``iter(dataset)`` raises (in each worker, with workers)."""

    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("the stream cannot be opened")


class CannotOpenAsync(aioload.IterableDataset[int]):
    """``aiter(dataset)`` raises (not an async generator: it raises when called)."""

    def __iter__(self) -> Iterator[int]:
        raise AssertionError("an async stream is read with __aiter__")

    def __aiter__(self) -> AsyncIterator[int]:
        raise RuntimeError("the stream cannot be opened")


def _control(kind: str) -> BaseException:
    return SystemExit(3) if kind == "exit" else KeyboardInterrupt()


class RaisesAtFive:
    """Key 5 raises ``SystemExit(3)`` or ``KeyboardInterrupt``; every sample is the reader's pid."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> int:
        if index == 5:
            raise _control(self.kind)
        return os.getpid()


class RaisesAtFiveAsync(RaisesAtFive):
    async def __getitem__(self, index: int) -> int:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__getitem__(index)


class ExitsAfterOneBatch:
    """A batch sampler that yields one batch, then raises ``SystemExit(5)``."""

    def __iter__(self) -> Iterator[list[int]]:
        yield [0, 1]
        raise SystemExit(5)

    def __len__(self) -> int:
        return 2


class Plain:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


# -- helpers ----------------------------------------------------------------------------


def notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


def drain(loader: DataLoader[Any], use_async: bool) -> tuple[list[Any], list[BaseException]]:
    """Every batch and every error of one epoch, going on after each error."""
    batches: list[Any] = []
    errors: list[BaseException] = []
    if not use_async:
        iterator = iter(loader)
        while True:
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
            except BaseException as error:
                errors.append(error)
        return batches, errors

    async def run() -> None:
        iterator = aiter(loader)
        while True:
            try:
                batches.append(await anext(iterator))
            except StopAsyncIteration:
                break
            except BaseException as error:
                errors.append(error)

    asyncio.run(run())
    return batches, errors


def first_error(loader: DataLoader[Any], use_async: bool) -> BaseException:
    """The first error of an epoch, raised out of a plain loop."""
    if not use_async:
        try:
            for _ in loader:
                pass
        except BaseException as error:
            return error
        raise AssertionError("the epoch raised nothing")

    async def run() -> BaseException:
        try:
            async for _ in loader:
                pass
        except BaseException as error:
            return error
        raise AssertionError("the epoch raised nothing")

    return asyncio.run(run())


ITERATION = pytest.mark.parametrize("use_async", [False, True], ids=["for", "async-for"])


# -- no ExceptionGroup ---------------------------------------------------------------------


@pytest.mark.timeout(60)
@ITERATION
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("dataset", [CannotOpen(), CannotOpenAsync()], ids=["sync", "async"])
def test_a_stream_that_cannot_be_opened_raises_its_own_error(
    dataset: Any, num_workers: int, use_async: bool
) -> None:
    loader = DataLoader(dataset, batch_size=2, num_workers=num_workers)
    error = first_error(loader, use_async)
    assert type(error) is RuntimeError, repr(error)
    assert str(error) == "the stream cannot be opened"
    assert "raised while opening the dataset's stream" in notes(error)
    if num_workers:
        assert "raised in DataLoader worker" in notes(error)


@pytest.mark.timeout(60)
@ITERATION
@pytest.mark.parametrize("num_workers", [0, 2])
def test_after_a_stream_failed_to_open_the_epoch_ends(num_workers: int, use_async: bool) -> None:
    loader = DataLoader(CannotOpen(), batch_size=2, num_workers=num_workers)
    batches, errors = drain(loader, use_async)
    assert batches == []
    assert [type(error) for error in errors] == [RuntimeError] * max(1, num_workers)


@pytest.mark.timeout(60)
@ITERATION
@pytest.mark.parametrize("backend", ["inline", "workers", "executor"])
def test_a_samplers_system_exit_reaches_the_consumer_as_itself(
    backend: str, use_async: bool
) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        loader = DataLoader(
            Plain(),
            batch_sampler=ExitsAfterOneBatch(),
            num_workers=2 if backend == "workers" else 0,
            executor=executor if backend == "executor" else None,
        )
        batches, errors = drain(loader, use_async)
    assert [batch.tolist() for batch in batches] == [[0, 1]]
    assert len(errors) == 1
    assert type(errors[0]) is SystemExit, repr(errors[0])
    assert errors[0].code == 5
    assert "raised while drawing keys from the sampler" in notes(errors[0])


@pytest.mark.timeout(60)
def test_an_epoch_whose_task_group_fails_delivers_the_error_itself() -> None:
    def make_backend(task_group: Any, sink: Any) -> Any:
        raise LookupError("no backend today")

    async def run() -> list[Delivery]:
        loop = asyncio.get_running_loop()
        output = LoopOutput(loop)
        settings = LoaderSettings(dataset=range(2), batch_size=2)  # one batch: [0, 1]
        epoch = Epoch(settings, make_backend, output=output, loop=loop)
        await epoch.run()  # returns: the error is the consumer's
        return [delivery for delivery in iter(output.get_nowait, None)]

    deliveries = asyncio.run(run())
    assert len(deliveries) == 2 and deliveries[1] is END
    assert type(deliveries[0].error) is LookupError, repr(deliveries[0].error)


def test_ungroup_gives_the_only_error_or_the_first_with_the_others_in_notes() -> None:
    only = LookupError("only")
    assert ungroup(ExceptionGroup("g", [only])) is only
    first, second = RuntimeError("first"), KeyboardInterrupt()
    assert ungroup(BaseExceptionGroup("g", [first, second])) is first
    assert "builtins.KeyboardInterrupt" in notes(first)
    users = ExceptionGroup("the user's own", [ValueError()])
    assert ungroup(ExceptionGroup("g", [users])) is users  # one level only
    plain = ValueError()
    assert ungroup(plain) is plain


# -- SystemExit and KeyboardInterrupt ------------------------------------------------------


CONTROL = pytest.mark.parametrize("kind", ["exit", "interrupt"])


def _check_control(kind: str, error: BaseException) -> None:
    if kind == "exit":
        assert type(error) is SystemExit, repr(error)
        assert error.code == 3
    else:
        assert type(error) is KeyboardInterrupt, repr(error)
    assert "raised while fetching batch 2 (keys [4, 5])" in notes(error)


@pytest.mark.timeout(60)
@CONTROL
@ITERATION
@pytest.mark.parametrize("dataset_type", [RaisesAtFive, RaisesAtFiveAsync], ids=["sync", "async"])
def test_control_flow_exceptions_inline(
    dataset_type: Callable[[str], RaisesAtFive], use_async: bool, kind: str
) -> None:
    batches, errors = drain(DataLoader(dataset_type(kind), batch_size=2), use_async)
    assert len(batches) == 5  # the iteration goes on after the failed batch
    assert len(errors) == 1
    _check_control(kind, errors[0])


@pytest.mark.timeout(60)
@CONTROL
@ITERATION
@pytest.mark.parametrize("dataset_type", [RaisesAtFive, RaisesAtFiveAsync], ids=["sync", "async"])
def test_control_flow_exceptions_in_a_worker_which_goes_on(
    dataset_type: Callable[[str], RaisesAtFive], use_async: bool, kind: str
) -> None:
    # No restart allowed: a worker that died of it would fail the epoch.
    loader = DataLoader(dataset_type(kind), batch_size=2, num_workers=2, max_worker_restarts=0)
    batches, errors = drain(loader, use_async)
    assert len(errors) == 1
    _check_control(kind, errors[0])
    assert "raised in DataLoader worker 0" in notes(errors[0])
    assert len(batches) == 5
    # Worker 0 read batch 2: batch 4 is its again, read by the same process.
    assert batches[3].tolist() == batches[0].tolist()


@pytest.mark.timeout(60)
@CONTROL
@ITERATION
@pytest.mark.parametrize("dataset_type", [RaisesAtFive, RaisesAtFiveAsync], ids=["sync", "async"])
def test_control_flow_exceptions_in_a_thread_pool_executor(
    dataset_type: Callable[[str], RaisesAtFive], use_async: bool, kind: str
) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        batches, errors = drain(
            DataLoader(dataset_type(kind), batch_size=2, executor=executor), use_async
        )
    assert len(batches) == 5
    assert len(errors) == 1
    _check_control(kind, errors[0])
    assert "raised in executor worker" in notes(errors[0])


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("not this one")


@pytest.mark.parametrize(
    ("error", "kind", "code"),
    [
        (SystemExit(7), SystemExit, 7),
        (SystemExit(_Unpicklable()), SystemExit, None),
        (KeyboardInterrupt(_Unpicklable()), KeyboardInterrupt, None),
        (RuntimeError(_Unpicklable()), WorkerError, None),
    ],
)
def test_an_error_report_rebuilds_exits_and_interrupts_as_themselves(
    error: BaseException, kind: type[BaseException], code: int | None
) -> None:
    rebuilt = ErrorReport.of(error).rebuild("DataLoader worker 0 (pid 1)")
    assert type(rebuilt) is kind
    if code is not None:
        assert isinstance(rebuilt, SystemExit) and rebuilt.code == code
    assert "raised in DataLoader worker 0 (pid 1)" in notes(rebuilt)


def test_an_exit_status_survives_tblibs_pickling() -> None:
    # dask installs tblib's exception pickling, which rebuilds SystemExit without its
    # __init__ (so without its code); a worker's SystemExit(3) must still exit with 3.
    import copyreg

    from tblib import pickling_support

    saved = dict(copyreg.dispatch_table)
    pickling_support.install(SystemExit)
    try:
        rebuilt = ErrorReport.of(SystemExit(3)).rebuild()
    finally:
        copyreg.dispatch_table.clear()
        copyreg.dispatch_table.update(saved)
    assert type(rebuilt) is SystemExit and rebuilt.code == 3
