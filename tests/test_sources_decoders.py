"""Decoders: images through Pillow, arrays, JSON, text, labels, user handlers, and errors that
name the sample, the field and the shard."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from aioload import DataLoader
from aioload.sources import (
    DecodeError,
    Decoder,
    ObjectDataset,
    ShardDataset,
    ShardWriter,
    decode_image,
    default_decode,
)
from aioload.sources.tar.dataset import default_decode as default_decode_of_shards


def encoded(array: np.ndarray, kind: str, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    image = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    options: dict[str, Any] = {"lossless": True} if kind == "WEBP" else {}
    image.save(buffer, kind, **options)
    return buffer.getvalue()


def gradient(height: int = 6, width: int = 8) -> np.ndarray:
    rows = np.arange(height, dtype=np.uint8)[:, None, None] * 20
    columns = np.arange(width, dtype=np.uint8)[None, :, None] * 10
    return (rows + columns + np.array([0, 1, 2], np.uint8)).astype(np.uint8)


@pytest.mark.parametrize("kind,extension", [("PNG", "png"), ("WEBP", "webp"), ("JPEG", "jpg")])
def test_images_decode_to_hwc_uint8_rgb(kind: str, extension: str) -> None:
    pixels = gradient()
    decoded = default_decode({"__key__": "k", extension: encoded(pixels, kind)})[extension]
    assert decoded.shape == (6, 8, 3) and decoded.dtype == np.uint8
    if kind == "JPEG":
        assert np.abs(decoded.astype(int) - pixels).max() < 40  # lossy
    else:
        assert np.array_equal(decoded, pixels)


def test_image_modes_are_converted_or_kept() -> None:
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 10
    png = encoded(gray, "PNG")
    assert default_decode({"png": png})["png"].shape == (3, 4, 3)  # RGB by default
    kept = Decoder(image_mode=None)({"png": png})["png"]
    assert kept.shape == (3, 4, 1) and np.array_equal(kept[:, :, 0], gray)
    rgba = np.dstack([gradient(3, 4), np.full((3, 4), 128, np.uint8)])
    assert Decoder(image_mode=None)({"png": encoded(rgba, "PNG")})["png"].shape == (3, 4, 4)
    assert decode_image(encoded(rgba, "PNG"), "L").shape == (3, 4, 1)
    deep = np.arange(12, dtype=np.uint16).reshape(3, 4) * 4000
    sixteen = decode_image(encoded(deep, "PNG"), None)
    assert sixteen.dtype.itemsize >= 2 and np.array_equal(sixteen[:, :, 0], deep)


def test_arrays_json_text_and_labels() -> None:
    npy, npz = io.BytesIO(), io.BytesIO()
    np.save(npy, np.arange(4))
    np.savez(npz, a=np.ones(2), b=np.zeros((1, 2)))
    sample = {
        "__key__": "k",
        "__url__": "s3://b/s.tar",
        "npy": npy.getvalue(),
        "npz": npz.getvalue(),
        "json": b'{"a": [1, 2]}',
        "txt": "héllo".encode(),
        "cls": b"7\n",
        "meta.label": b"3",
        "bin": b"\x00\x01",
        "already": 5,
    }
    decoded = default_decode(sample)
    assert decoded["npy"].tolist() == [0, 1, 2, 3]
    assert sorted(decoded["npz"]) == ["a", "b"] and decoded["npz"]["b"].shape == (1, 2)
    assert decoded["json"] == {"a": [1, 2]}
    assert (decoded["txt"], decoded["cls"], decoded["meta.label"]) == ("héllo", 7, 3)
    assert decoded["bin"] == b"\x00\x01" and decoded["already"] == 5
    assert decoded["__url__"] == "s3://b/s.tar"
    assert default_decode_of_shards is default_decode  # still importable where it was


def upper(data: bytes) -> str:
    return data.decode().upper()


def test_user_handlers_merge_over_the_defaults() -> None:
    sample = {"__key__": "k", "txt": b"cat", "cls": b"1", "seg.png": b"raw", "pts": b"a,b"}
    decoder = Decoder({".TXT": upper, "seg.png": None, "pts": lambda b: b.split(b",")})
    decoded = decoder(sample)
    assert decoded == {
        "__key__": "k",
        "txt": "CAT",
        "cls": 1,
        "seg.png": b"raw",
        "pts": [b"a", b"b"],
    }
    only = Decoder({"txt": upper}, defaults=False)(sample)
    assert only["txt"] == "CAT" and only["cls"] == b"1"
    assert "txt" in decoder.handlers and decoder.handler("x.TXT") is upper
    with pytest.raises(TypeError, match="callable"):
        Decoder({"jpg": "nope"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="decode should be callable"):
        ShardDataset("file:///x/a.tar", decode=42)  # type: ignore[arg-type]


def test_a_failing_field_names_the_key_the_field_and_the_shard() -> None:
    sample = {"__key__": "000017", "__url__": "s3://bucket/train-0003.tar", "json": b"{oops"}
    with pytest.raises(DecodeError) as caught:
        default_decode(sample)
    error = caught.value
    message = str(error)
    assert "'json'" in message and "'000017'" in message and "s3://bucket/train-0003.tar" in message
    assert (error.key, error.field, error.url) == ("000017", "json", "s3://bucket/train-0003.tar")
    assert isinstance(error, ValueError) and isinstance(error.__cause__, json.JSONDecodeError)
    error.add_note("raised in a worker")
    again = pickle.loads(pickle.dumps(error))
    assert (again.key, again.field, again.url, str(again)) == (
        error.key,
        error.field,
        error.url,
        message,
    )
    assert again.__notes__ == ["raised in a worker"]


def test_a_missing_pillow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'aioload-data\[image\]'") as caught:
        default_decode({"__key__": "k", "__url__": "file:///s.tar", "jpg": b"\xff\xd8"})
    assert any("'jpg' of sample 'k'" in note for note in caught.value.__notes__)
    # Images kept as bytes need no Pillow.
    assert Decoder({"jpg": None})({"jpg": b"\xff\xd8"}) == {"jpg": b"\xff\xd8"}


def labelled_image(decoded: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    return decoded["cls"], decoded["jpg"].shape


def test_shards_decode_in_the_workers_and_report_bad_fields(tmp_path: Path) -> None:
    pixels = gradient()
    with ShardWriter(str(tmp_path / "img-%d.tar"), maxcount=4) as writer:
        for i in range(8):
            writer.write({"__key__": f"{i:03d}", "jpg": encoded(pixels, "JPEG"), "cls": i})
    good = [Path(p).as_uri() for p in writer.shards]
    # A mapping merges over the defaults (here: JPEG kept in the file's own mode).
    dataset = ShardDataset(good, decode={"jpg": functools.partial(decode_image, mode=None)})
    assert isinstance(dataset.decode, Decoder)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list)
    results = sorted(labelled_image(sample) for batch in loader for sample in batch)
    assert results == [(i, (6, 8, 3)) for i in range(8)]
    with ShardWriter(str(tmp_path / "bad-%d.tar")) as writer:
        writer.write({"__key__": "b00", "jpg": b"not a jpeg", "cls": 0})
    bad = ShardDataset(Path(writer.shards[0]).as_uri(), decode=default_decode)
    with pytest.raises(DecodeError, match=r"field 'jpg' of sample 'b00' in file://.*bad-0\.tar"):
        for _ in DataLoader(bad, batch_size=1, num_workers=1, collate_fn=list):
            pass


def test_objects_decode_by_their_key(tmp_path: Path) -> None:
    folder = tmp_path / "objects"
    folder.mkdir()
    (folder / "a.json").write_bytes(b'{"x": 1}')
    (folder / "b.png").write_bytes(encoded(gradient(2, 3), "PNG"))
    (folder / "c.bin").write_bytes(b"\x01")
    (folder / "d.json").write_bytes(b"{")
    dataset = ObjectDataset(
        folder.as_uri() + "/", ["a.json", "b.png", "c.bin", "d.json"], decode={}
    )

    async def read() -> list[Any]:
        return [await dataset[i] for i in range(3)]

    a, b, c = asyncio.run(read())
    assert a == {"x": 1} and b.shape == (2, 3, 3) and c == b"\x01"
    with pytest.raises(DecodeError, match=r"field 'd\.json' of sample 'd\.json' in file://"):
        asyncio.run(dataset[3])


def _user_decode(value: Any) -> tuple[str, Any, tuple[int, int]]:
    """What a user's decoder does with an object's or a field's bytes."""
    if isinstance(value, dict):  # a shard's sample: decode its fields
        return "sample", json.loads(value["json"]), Image.open(io.BytesIO(value["png"])).size
    return type(value).__name__, json.loads(value), (0, 0)


def test_user_decoders_get_bytes_that_json_loads_and_pillow_read(tmp_path: Path) -> None:
    png = encoded(gradient(6, 8), "PNG")
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "a.json").write_text('{"label": 3}')
    with ShardWriter(str(tmp_path / "shard-%d.tar"), maxcount=10) as writer:
        writer.write({"__key__": "0000", "json": {"label": 3}, "png": png})
    root = tmp_path.as_uri()
    # a real tar shard: the sample's fields
    shards = ShardDataset(root + "/shard-0.tar", decode=_user_decode)
    assert list(DataLoader(shards, batch_size=None)) == [["sample", {"label": 3}, [8, 6]]]
    # one object, read from the store, then from the cache (each may hand another buffer)
    for cache in (None, tmp_path / "cache", tmp_path / "cache"):
        objects = ObjectDataset(
            root + "/objects/", ["a.json"], decode=_user_decode, cache_dir=cache
        )
        assert asyncio.run(objects["a.json"]) == ("bytes", {"label": 3}, (0, 0))
        ranged = ObjectDataset(
            root + "/objects/", ["a.json"], byte_range=(0, 12), decode=_user_decode
        )
        assert asyncio.run(ranged["a.json"]) == ("bytes", {"label": 3}, (0, 0))


def test_a_handler_gets_bytes_whatever_buffer_the_field_holds() -> None:
    seen = []

    def as_json(data: bytes) -> Any:
        seen.append(type(data))
        return json.loads(data)

    def size(data: bytes) -> tuple[int, int]:
        seen.append(type(data))
        return Image.open(io.BytesIO(data)).size

    decode = Decoder({"json": as_json, "png": size})
    png = bytearray(encoded(gradient(2, 3), "PNG"))
    sample = {"__key__": "k", "json": memoryview(b'{"a": 1}'), "png": png}
    assert decode(sample) == {"__key__": "k", "json": {"a": 1}, "png": (3, 2)}
    assert seen == [bytes, bytes]
