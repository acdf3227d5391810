"""ShardWriter: writes samples into WebDataset-style tar shards on the local disk.

Beside each shard it writes the shard's index (``shard.tar.idx.json``, see
:mod:`aioload.sources.tar.index`): where every sample starts and how long it is, known
as the samples are written, so that a reader can split the shard at any sample.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

import numpy as np

from aioload.checks import is_int
from aioload.sources.tar.index import INDEX_SUFFIX, ShardIndex

__all__ = ["ShardWriter"]

_MTIME = 0  # every member gets the same time: the same samples give byte-identical shards


def _encode(field: str, value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.ndarray | np.generic):
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(value), allow_pickle=False)
        return buffer.getvalue()
    if isinstance(value, bool):
        raise TypeError(f"field {field!r}: a bool has no encoding; use an int or a str")
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, dict | list):
        return json.dumps(value).encode()
    raise TypeError(
        f"field {field!r}: cannot encode {type(value).__name__}; use bytes, str, a numpy "
        "array (stored as .npy), an int, or a dict/list (stored as JSON)"
    )


_DRIVE = re.compile(r"[A-Za-z]:")


def _check_key(key: str) -> None:
    """Refuses a key that is not a safe relative member name (see :class:`ShardWriter`)."""
    allowed = (
        "a key is a relative path of '/'-separated names, none of them empty, '.' or '..', "
        "without backslashes or NUL bytes, such as 'train/000017'"
    )
    problem = None
    if "\x00" in key:
        problem = "holds a NUL byte"
    elif "\\" in key:
        problem = "holds a backslash (a folder separator on Windows)"
    elif key.startswith("/"):
        problem = "is an absolute path"
    elif _DRIVE.match(key):
        problem = "starts with a drive letter"
    else:
        bad = [part for part in key.split("/") if part in ("", ".", "..")]
        if bad:
            problem = (
                f"has a path component {bad[0]!r}" if bad[0] else "has an empty path component"
            )
    if problem is not None:
        # tarfile.extractall without a filter would write such a member outside its folder.
        raise ValueError(f"sample key {key!r} {problem}: {allowed}")


def _check_field(key: str, field: Any) -> None:
    if not isinstance(field, str):
        raise TypeError(f"sample {key!r}: a field name should be a str; got {field!r}")
    if not field or "/" in field or "\\" in field or "\x00" in field:
        raise ValueError(
            f"sample {key!r}: field {field!r} is not a member extension: a field is a "
            "non-empty str without '/', backslashes or NUL bytes, such as 'jpg' or 'seg.png'"
        )


class ShardWriter:
    """Writes samples into a numbered series of tar shards (WebDataset layout).

    A sample is a mapping with a ``"__key__"`` and one entry per field. The key
    is a safe relative path (``"000017"``, ``"train/000017"``): ``/``-separated
    names, none empty, ``.`` or ``..``, no backslash, NUL byte, leading ``/``
    or drive letter, and no dot in the last name; anything else raises
    ``ValueError``, so that no shard can extract outside its folder. A field's
    name is the member's extension (``"jpg"``, ``"cls"``, ``"npy"``; no ``/``),
    its value bytes, a str
    (UTF-8), a numpy array (written in ``.npy`` format), an int (as text) or a
    dict/list (JSON). Other ``"__...__"`` entries are ignored. A new shard
    starts once the current one holds ``maxcount`` samples or would pass
    ``maxsize`` bytes. Shards are byte-identical for the same samples.

    Beside each finished shard goes its index, the shard's name with ``.idx.json``
    appended (``s-000.tar.idx.json``; see :mod:`aioload.sources.tar.index`): every
    sample's key, byte offset and size. :class:`~aioload.sources.ShardDataset` reads it
    to split shards between ranks at sample granularity without reading them first;
    upload it with its shard.

    Args:
        pattern: the shard file names, with one ``%d``-style field for the
            shard number, e.g. ``"out/train-%06d.tar"`` (folders are created).
        maxcount: the most samples per shard.
        maxsize: the most bytes per shard (a single larger sample still gets a
            shard of its own).
        start_shard: the number of the first shard.
        index: write each shard's index file beside it (default True).

    Example::

        >>> import tempfile, os
        >>> folder = tempfile.TemporaryDirectory()
        >>> with ShardWriter(os.path.join(folder.name, "s-%03d.tar"), maxcount=2) as writer:
        ...     for i in range(5):
        ...         writer.write({"__key__": f"{i:04d}", "cls": i, "txt": "hello"})
        >>> [os.path.basename(path) for path in writer.shards]
        ['s-000.tar', 's-001.tar', 's-002.tar']
        >>> [os.path.basename(path) for path in writer.indexes][:1]
        ['s-000.tar.idx.json']
        >>> folder.cleanup()
    """

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        *,
        start_shard: int = 0,
        index: bool = True,
    ) -> None:
        if not isinstance(pattern, str):
            raise TypeError(
                f"pattern should be a str such as 'out/shard-%06d.tar'; got {pattern!r}"
            )
        try:
            first = pattern % start_shard
        except (TypeError, ValueError):
            raise ValueError(
                f"pattern should hold one %d-style field for the shard number, such as "
                f"'out/shard-%06d.tar'; got {pattern!r}"
            ) from None
        if first == pattern % (start_shard + 1):
            raise ValueError(f"pattern {pattern!r} gives every shard the same name")
        if not is_int(maxcount) or maxcount < 1:
            raise ValueError(f"maxcount should be a positive int; got {maxcount!r}")
        if not maxsize > 0:
            raise ValueError(f"maxsize should be a positive number of bytes; got {maxsize!r}")
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.shards: list[str] = []
        """The files written so far (the last one may still be open)."""
        self.index = bool(index)
        self.indexes: list[str] = []
        """The index files written so far, one per finished shard (with ``index=True``)."""
        self._number = start_shard
        self._file: IO[bytes] | None = None
        self._tar: tarfile.TarFile | None = None
        self._count = 0
        self._size = 0
        self._keys: list[str] = []
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._closed = False

    def write(self, sample: Mapping[str, Any]) -> None:
        """Appends one sample (see the class docstring)."""
        if self._closed:
            raise ValueError("write() on a closed ShardWriter")
        key = sample.get("__key__") if isinstance(sample, Mapping) else None
        if not isinstance(key, str) or not key:
            raise ValueError(f"a sample needs a '__key__' str; got {sample!r:.200}")
        _check_key(key)
        if "." in key.rpartition("/")[2]:
            raise ValueError(
                f"sample key {key!r}: its last path component must not hold a dot (the dot "
                "separates the key from the field in member names)"
            )
        members = []
        for field, value in sample.items():
            _check_field(key, field)
            if not field.startswith("__"):
                members.append((f"{key}.{field}", _encode(field, value)))
        if not members:
            raise ValueError(f"sample {key!r} has no fields besides its key")
        size = sum(512 + len(body) + (-len(body) % 512) for _, body in members)
        if self._tar is not None and (
            self._count >= self.maxcount or self._size + size > self.maxsize
        ):
            self._finish()
        if self._tar is None:
            self._start()
        tar = self._tar
        assert tar is not None
        begin = tar.offset  # the sample's first header (a pax header for a long name)
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mtime = _MTIME
            info.mode = 0o444
            tar.addfile(info, io.BytesIO(body))
        self._keys.append(key)
        self._offsets.append(begin)
        self._sizes.append(tar.offset - begin)
        self._count += 1
        self._size += size

    def _start(self) -> None:
        path = self.pattern % self._number
        self._number += 1
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._file = open(path, "wb")  # noqa: SIM115  # closed by _finish
        self._tar = tarfile.open(  # noqa: SIM115  # closed by _finish
            fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT
        )
        self.shards.append(path)
        self._count = self._size = 0
        self._keys, self._offsets, self._sizes = [], [], []

    def _finish(self) -> None:
        tar, file = self._tar, self._file
        self._tar = self._file = None
        try:
            if tar is not None:
                tar.close()
            if file is not None and self.index:
                self._write_index(self.shards[-1], file.tell())
        finally:
            if file is not None:
                file.close()

    def _write_index(self, shard: str, shard_size: int) -> None:
        index = ShardIndex(self._keys, self._offsets, self._sizes, shard_size, where=shard)
        path = shard + INDEX_SUFFIX
        with open(path, "wb") as file:
            file.write(index.to_json())
        self.indexes.append(path)

    def close(self) -> None:
        """Finishes the last shard. Writing afterwards raises."""
        self._closed = True
        self._finish()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
