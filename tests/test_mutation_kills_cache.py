"""LocalCache driven directly: identities, short writes, a failing folder
(aioload/sources/cache/local.py).

Written for the survivors of the mutation run (docs/testing/mutation.md): two stores'
objects of the same URL are two entries, an entry written by a disk that takes a few
bytes per write is still the store's bytes, and a folder that fails between taking an
entry's lock and looking again is read past, the lock let go.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aioload.sources.cache.folder import CacheFolder
from aioload.sources.cache.local import LocalCache
from aioload.stats.source_counts import SourceCounter

DATA = bytes(range(256)) * 40  # 10 KiB


class Store:
    """What entry_identity reads of an object store: its ``config``."""

    def __init__(self, config: Any) -> None:
        self.config = config


class Remote:
    """An object in a store: ``DATA`` in chunks, from any offset; counts the opens."""

    def __init__(self, chunk: int = 1000) -> None:
        self.chunk = chunk
        self.opened: list[int] = []

    async def open(self, offset: int) -> tuple[int, AsyncIterator[bytes]]:
        self.opened.append(offset)

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(offset, len(DATA), self.chunk):
                await asyncio.sleep(0)
                yield DATA[start : start + self.chunk]

        return len(DATA), chunks()

    async def fetch(self) -> bytes:
        self.opened.append(0)
        return DATA


async def streamed(cache: LocalCache, remote: Remote) -> bytes:
    parts = [c async for c in cache.stream("id", "shard.tar", remote.open, SourceCounter())]
    return b"".join(parts)


def test_an_entry_written_a_few_bytes_at_a_time_holds_the_stores_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite

    def short(fd: int, data: Any, offset: int) -> int:
        return real(fd, bytes(data[:7]), offset)  # a disk that takes 7 bytes a call

    cache, remote = LocalCache(tmp_path), Remote()
    with monkeypatch.context() as patched:
        patched.setattr(os, "pwrite", short)
        assert asyncio.run(streamed(cache, remote)) == DATA
    assert asyncio.run(streamed(cache, remote)) == DATA  # from the cache
    assert remote.opened == [0]


def test_a_folder_failing_after_the_lock_is_read_past_and_the_lock_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks = 0
    real = CacheFolder.open_entry

    def failing_second_look(self: CacheFolder, files: Any) -> int | None:
        nonlocal looks
        looks += 1
        if looks == 2:  # the look again once the entry's lock is ours
            raise PermissionError("the folder went read-only")
        return real(self, files)

    cache, remote = LocalCache(tmp_path), Remote()
    with monkeypatch.context() as patched:
        patched.setattr(CacheFolder, "open_entry", failing_second_look)
        assert asyncio.run(cache.read("id", "obj.bin", remote.fetch, SourceCounter())) == DATA
    assert looks == 2
    assert not list(tmp_path.rglob("*.lock"))  # nobody waits on a lock left behind
    # The folder works again: the object is fetched once more and kept this time.
    assert asyncio.run(cache.read("id", "obj.bin", remote.fetch, SourceCounter())) == DATA
    assert asyncio.run(cache.read("id", "obj.bin", remote.fetch, SourceCounter())) == DATA
    assert remote.opened == [0, 0]
