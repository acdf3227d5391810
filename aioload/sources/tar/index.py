"""The index of a tar shard: every sample's key, byte offset and size, and its file format.

Sample ``i`` of a shard occupies bytes ``offsets[i]`` to ``offsets[i] + sizes[i]`` of it:
the headers of its members (long-name and pax headers included), their bodies and their
padding. It starts at a header, so the tar reader can start there, and samples ``a`` to
``b - 1`` are one byte-range request (:meth:`ShardIndex.byte_range`). With the index a
shard can be split, and a read resumed, at any sample.

**The file.** One per shard, beside it, named after it with :data:`INDEX_SUFFIX` appended
(``train-000017.tar`` → ``train-000017.tar.idx.json``), UTF-8 JSON::

    {"format": "aioload.shard-index", "version": 1, "shard_size": 30720,
     "keys": ["000000", "000001"], "offsets": [0, 3584], "sizes": [3584, 3584]}

One file per shard rather than one for the set: shards are copied, listed, subset and
reordered one by one, and an index travels (and goes stale) with its shard only.
``shard_size`` is the shard's length in bytes when the index was made; a reader compares it
with the object it reads, so a shard rewritten under an old index is refused, not misread.

**Validated when read.** An index file is outside data: :meth:`ShardIndex.from_json` checks
the format name and version, every field's type, that the lists have one entry per sample,
that offsets and sizes are whole 512-byte tar blocks, that samples do not overlap and run in
order, and that they end within ``shard_size``. Anything else raises
:class:`ShardIndexError` (a ``ValueError``) naming the file; nothing else escapes. Extra
fields are ignored (a later version 1 writer may add some); another version is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from aioload.checks import is_integral
from aioload.errors import ShardIndexError

__all__ = ["INDEX_FORMAT", "INDEX_SUFFIX", "INDEX_VERSION", "ShardIndex", "ShardIndexError"]

INDEX_SUFFIX = ".idx.json"
"""What a shard's index file adds to the shard's name (``a.tar`` → ``a.tar.idx.json``)."""

INDEX_FORMAT = "aioload.shard-index"
"""The ``"format"`` field of every index file."""

INDEX_VERSION = 1
"""The version of the index file layout this aioload writes and reads."""

BLOCK = 512  # a tar block: every header, body and padding is made of whole blocks


Offsets = npt.NDArray[np.int64]


class ShardIndex:
    """Where each sample of one tar shard lies: its key, byte offset and size.

    Built by :class:`~aioload.sources.ShardWriter` as it writes a shard, by reading a
    shard's tar headers (:func:`~aioload.sources.tar.scan.scan_tar`), or read from an
    index file (:meth:`from_json`). Every way checks it (see the module docstring).

    Args:
        keys: the samples' keys, in the shard's order.
        offsets: each sample's first byte (a header) in the shard.
        sizes: each sample's bytes, from its first header to the end of its last
            member's padding.
        shard_size: the shard's length in bytes.
        where: what to name in error messages (the index file's URL).

    Attributes:
        keys: the keys (a tuple of str).
        offsets: the offsets (a read-only int64 array).
        sizes: the sizes (a read-only int64 array).
        shard_size: the shard's length in bytes.

    Raises:
        ShardIndexError: the fields do not describe samples of a tar shard.

    Example::

        >>> index = ShardIndex(["a", "b", "c"], [0, 1024, 2048], [1024, 1024, 1536], 4608)
        >>> len(index), index.byte_range(1, 3)
        (3, (1024, 3584))
        >>> ShardIndex.from_json(index.to_json(), "a.tar.idx.json") == index
        True
    """

    __slots__ = ("keys", "offsets", "shard_size", "sizes")

    keys: tuple[str, ...]
    offsets: Offsets
    sizes: Offsets
    shard_size: int

    def __init__(
        self,
        keys: Sequence[str],
        offsets: Sequence[int] | Offsets,
        sizes: Sequence[int] | Offsets,
        shard_size: int,
        *,
        where: str = "shard index",
    ) -> None:
        keys = tuple(keys)
        for key in keys:
            if not isinstance(key, str) or not key:
                _fail(where, f"a key should be a non-empty str; got {key!r:.80}")
        if not _is_count(shard_size) or shard_size >= 2**63:
            _fail(
                where, f"'shard_size' should be an int >= 0 and below 2**63; got {shard_size!r:.80}"
            )
        starts = _int64s(offsets, "offsets", where)
        lengths = _int64s(sizes, "sizes", where)
        if not len(keys) == len(starts) == len(lengths):
            _fail(
                where,
                f"'keys', 'offsets' and 'sizes' should have one entry per sample; they have "
                f"{len(keys)}, {len(starts)} and {len(lengths)}",
            )
        if len(keys):
            _check_layout(starts, lengths, int(shard_size), where)
        starts.setflags(write=False)
        lengths.setflags(write=False)
        self.keys = keys
        self.offsets = starts
        self.sizes = lengths
        self.shard_size = int(shard_size)

    def __len__(self) -> int:
        """The shard's number of samples."""
        return len(self.keys)

    def byte_range(self, start: int, stop: int) -> tuple[int, int]:
        """The bytes ``(first, end)`` (end exclusive) holding samples ``start`` to ``stop - 1``.

        Raises:
            IndexError: not ``0 <= start < stop <= len(self)``.
        """
        if not 0 <= start < stop <= len(self.keys):
            raise IndexError(
                f"samples {start} to {stop - 1} are not a range of this shard's {len(self.keys)}"
            )
        return int(self.offsets[start]), int(self.offsets[stop - 1] + self.sizes[stop - 1])

    def to_json(self) -> bytes:
        """The index file's content (see the module docstring)."""
        document = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "shard_size": self.shard_size,
            "keys": list(self.keys),
            "offsets": self.offsets.tolist(),
            "sizes": self.sizes.tolist(),
        }
        # ASCII: a key decoded with surrogateescape (a non-UTF-8 member name) survives.
        return json.dumps(document, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str, where: str) -> ShardIndex:
        """Reads and checks an index file's content.

        Args:
            data: the file's bytes (UTF-8 JSON) or text.
            where: the file's URL, for error messages.

        Raises:
            ShardIndexError: anything but a valid index of a version this aioload reads.
        """
        try:
            text = data if isinstance(data, str) else bytes(data).decode("utf-8")
            document = json.loads(text)
        except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
            _fail(where, f"not UTF-8 JSON ({type(error).__name__}: {str(error)[:120]})")
        if not isinstance(document, dict):
            _fail(where, f"should be a JSON object; got {type(document).__name__}")
        if document.get("format") != INDEX_FORMAT:
            _fail(
                where,
                f"'format' should be {INDEX_FORMAT!r}; got {document.get('format')!r:.80}",
            )
        version = document.get("version")
        if version != INDEX_VERSION or not _is_count(version):
            _fail(
                where,
                f"has version {version!r:.40}; this aioload reads version {INDEX_VERSION} "
                "(build the index again)",
            )
        fields: dict[str, Any] = {}
        for name in ("keys", "offsets", "sizes"):
            value = document.get(name)
            if not isinstance(value, list):
                _fail(where, f"{name!r} should be a list; got {type(value).__name__}")
            fields[name] = value
        for name in ("offsets", "sizes"):
            bad = next((v for v in fields[name] if not _is_count(v)), None)
            if bad is not None:
                _fail(where, f"{name!r} should hold ints >= 0; got {bad!r:.80}")
        return cls(
            fields["keys"],
            fields["offsets"],
            fields["sizes"],
            document.get("shard_size"),  # type: ignore[arg-type]  # checked by the constructor
            where=where,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardIndex):
            return NotImplemented
        return (
            self.keys == other.keys
            and self.shard_size == other.shard_size
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.sizes, other.sizes)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking arrays: compared, not hashed

    def __getstate__(self) -> tuple[Any, ...]:
        return self.keys, self.offsets, self.sizes, self.shard_size

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.keys, self.offsets, self.sizes, self.shard_size = state

    def __repr__(self) -> str:
        first = f", first {self.keys[0]!r}" if self.keys else ""
        return f"ShardIndex({len(self.keys)} samples{first}, shard of {self.shard_size} bytes)"


def _fail(where: str, problem: str) -> NoReturn:
    raise ShardIndexError(f"{where}: bad shard index: {problem}")


def _is_count(value: object) -> bool:
    return is_integral(value) and value >= 0  # type: ignore[operator]


def _int64s(values: Sequence[int] | Offsets, name: str, where: str) -> Offsets:
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
            _fail(where, f"{name!r} should be a flat array of ints; got {values.dtype}")
    else:
        bad = next((v for v in values if not is_integral(v)), None)
        if bad is not None:
            _fail(where, f"{name!r} should hold ints; got {bad!r:.80}")
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        _fail(where, f"{name!r} should hold ints below 2**63")


def _check_layout(offsets: Offsets, sizes: Offsets, shard_size: int, where: str) -> None:
    """Samples of whole blocks, in order, not overlapping, within the shard."""
    if offsets.min() < 0 or sizes.min() < BLOCK:
        _fail(where, f"offsets should be >= 0 and sizes >= {BLOCK} (a header at least)")
    if np.any(offsets % BLOCK) or np.any(sizes % BLOCK):
        _fail(where, f"offsets and sizes should be whole {BLOCK}-byte tar blocks")
    # Both are in [0, 2**63): their sums fit in uint64 without overflowing.
    ends = offsets.astype(np.uint64) + sizes.astype(np.uint64)
    overlaps = ends[:-1] > offsets[1:].astype(np.uint64)
    if np.any(overlaps):
        first = int(np.argmax(overlaps))
        _fail(
            where,
            f"sample {first} (bytes {offsets[first]} to {ends[first]}) overlaps the next one "
            f"(from byte {offsets[first + 1]}): samples run in order, without overlapping",
        )
    if int(ends[-1]) > shard_size:
        _fail(
            where,
            f"the last sample ends at byte {ends[-1]}, past the shard's {shard_size} bytes",
        )
