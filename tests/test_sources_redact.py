"""Credentials in a URL's userinfo never show in reprs, error messages or their tracebacks."""

from __future__ import annotations

import socket
import traceback
from pathlib import Path
from typing import Any

import pytest

from aioload.sources import ObjectDataset, ShardDataset, ShardWriter, expand_urls, open_store
from aioload.urls import redact_url

SECRET = "s3cr3t-pa55"


def shown(error: BaseException) -> str:
    """Everything a traceback of ``error`` prints (its chain included), and its ``url``."""
    return "".join(traceback.format_exception(error)) + str(getattr(error, "url", ""))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://user:pw@host/x", "http://user:***@host/x"),
        ("https://token@host:8443/x?q=a@b", "https://***@host:8443/x?q=a@b"),
        ("http://user:p@ss@127.0.0.1:9/x", "http://user:***@127.0.0.1:9/x"),  # the last '@'
        ("http://user:***@host/", "http://user:***@host/"),
        ("s3://bucket/key@2x.png", "s3://bucket/key@2x.png"),  # an '@' after the authority
        ("mail me@host, see http://host/a", "mail me@host, see http://host/a"),
        (
            "GET 'http://a:pw@h1/x' then http://b:pw2@h2:9 failed",
            "GET 'http://a:***@h1/x' then http://b:***@h2:9 failed",
        ),
        ("no URL at all", "no URL at all"),
    ],
)
def test_redact_url(text: str, expected: str) -> None:
    assert redact_url(text) == expected
    assert redact_url(expected) == expected


def test_reprs_hide_the_password(object_server: Any) -> None:
    base = object_server.url.replace("http://", f"http://reader:{SECRET}@")
    objects = ObjectDataset(base + "/objects/")
    shards = ShardDataset(base + "/redact/part-{0..3}.tar")
    for text in (repr(objects), repr(objects.listing()), repr(shards)):
        assert SECRET not in text
        assert "reader:***@127.0.0.1" in text
    with pytest.raises(TypeError) as caught:
        len(objects)
    assert SECRET not in shown(caught.value)


@pytest.mark.asyncio
async def test_read_errors_and_samples_hide_the_password(
    object_server: Any, object_folder: Path
) -> None:
    with ShardWriter(str(object_folder / "redact" / "part-%d.tar")) as writer:
        writer.write({"__key__": "0001", "cls": 1})
    (object_folder / "redact" / "broken.tar").write_bytes(b"\x00" * 100)
    base = object_server.url.replace("http://", f"http://reader:{SECRET}@")

    objects = ObjectDataset(base + "/objects/")
    assert len(await objects["00000.bin"]) > 0  # the store works with such a URL
    with pytest.raises(FileNotFoundError, match=r"reader:\*\*\*@.*/objects/missing\.bin") as e1:
        await objects["missing.bin"]
    with pytest.raises(FileNotFoundError, match=r"reader:\*\*\*@.*/redact/none\.tar") as e2:
        [sample async for sample in ShardDataset(base + "/redact/none.tar")]
    with pytest.raises(ValueError, match=r"reader:\*\*\*@.*/redact/broken\.tar: truncated") as e3:
        [sample async for sample in ShardDataset(base + "/redact/broken.tar")]
    for caught in (e1, e2, e3):
        assert SECRET not in shown(caught.value)
    samples = [sample async for sample in ShardDataset(base + "/redact/part-0.tar")]
    assert [s["__key__"] for s in samples] == ["0001"]
    assert samples[0]["__url__"] == redact_url(base) + "/redact/part-0.tar"


def test_store_errors_hide_the_password(no_cloud_env: None) -> None:
    cases: list[tuple[type[Exception], Any]] = [
        (ValueError, lambda: open_store(f"ftp://u:{SECRET}@host/x")),
        (ValueError, lambda: open_store(f"file://u:{SECRET}@host/x")),
        (
            TypeError,
            lambda: open_store(f"http://u:{SECRET}@127.0.0.1:9/x", storage_options={"region": "x"}),
        ),
        (ValueError, lambda: ObjectDataset(f"s3://u:{SECRET}@bucket/x/")),  # no credentials
        (ValueError, lambda: ShardDataset(f"http://u:{SECRET}@127.0.0.1:9/folder/")),
        (ValueError, lambda: expand_urls(f"http://u:{SECRET}@127.0.0.1:9/a-{{5..1.tar")),
    ]
    for kind, build in cases:
        with pytest.raises(kind) as caught:
            build()
        assert SECRET not in shown(caught.value)
        assert "u:***@" in str(caught.value)


@pytest.mark.asyncio
async def test_an_endpoint_with_a_password_is_hidden_in_errors() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dataset = ObjectDataset(
        "s3://bucket/",
        storage_options={
            "endpoint": f"http://key:{SECRET}@127.0.0.1:{port}",
            "skip_signature": True,
            "retry_config": {"max_retries": 1},
        },
    )
    with pytest.raises(ConnectionError, match=r"s3://bucket/k\.bin: cannot reach") as caught:
        await dataset["k.bin"]
    assert SECRET not in shown(caught.value)
    assert f"key:***@127.0.0.1:{port}" in str(caught.value)  # obstore names the endpoint
