"""Store options as one ``storage_options`` mapping on every source (fsspec's convention).

A misspelt argument of a dataset is Python's own ``TypeError`` naming it, never a store
configuration error; a misspelt store option is a ``TypeError`` naming the option and the
store's URL; the keys mean what obstore's configuration keys mean.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from aioload.sources import (
    IterableParquetDataset,
    JsonLinesDataset,
    ObjectDataset,
    ParquetDataset,
    ShardDataset,
    index_shards,
    open_store,
)
from aioload.sources.cache.local import LocalCache
from aioload.sources.stores.store import StoreLocation

ANONYMOUS = {"skip_signature": True, "endpoint": "http://127.0.0.1:9"}

# Each source with a URL it accepts (no request is sent at construction).
SOURCES: dict[str, Callable[..., Any]] = {
    "ObjectDataset": lambda **kw: ObjectDataset("s3://bucket/images/", ["a.jpg"], **kw),
    "ShardDataset": lambda **kw: ShardDataset("s3://bucket/train-{0..3}.tar", **kw),
    "JsonLinesDataset": lambda **kw: JsonLinesDataset("s3://bucket/rows.jsonl", **kw),
    "ParquetDataset": lambda **kw: ParquetDataset("s3://bucket/table/", **kw),
    "IterableParquetDataset": lambda **kw: IterableParquetDataset("s3://bucket/table/", **kw),
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_misspelt_argument_is_a_type_error_naming_it(source: str) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'shufle_buffer'"):
        SOURCES[source](shufle_buffer=4, storage_options=ANONYMOUS)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_store_options_as_keywords_are_refused(source: str) -> None:
    # The old spelling, ObjectDataset(url, endpoint=...), is gone: one mapping, one meaning.
    with pytest.raises(TypeError, match="unexpected keyword argument 'skip_signature'"):
        SOURCES[source](skip_signature=True)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_misspelt_store_option_names_the_option_and_the_store(
    source: str, no_cloud_env: None
) -> None:
    with pytest.raises(TypeError, match=r"s3://bucket/.*endpiont"):
        SOURCES[source](storage_options={"skip_signature": True, "endpiont": "http://x"})


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_storage_options_should_be_a_mapping(source: str) -> None:
    with pytest.raises(TypeError, match="storage_options should be a mapping"):
        SOURCES[source](storage_options=[("skip_signature", True)])
    with pytest.raises(TypeError, match="keys should be str"):
        SOURCES[source](storage_options={1: True})


def test_every_source_takes_storage_options_and_no_keywords_of_its_own() -> None:
    takers = [*(type(SOURCES[name](storage_options=ANONYMOUS)) for name in SOURCES)]
    for function in [*(kind.__init__ for kind in takers), open_store, index_shards]:
        parameters = inspect.signature(function).parameters
        assert parameters["storage_options"].kind is inspect.Parameter.KEYWORD_ONLY, function
        assert parameters["storage_options"].default is None
        kinds = {parameter.kind for parameter in parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, function
    # the cache takes no store options: its entries are named by the store's settings
    assert "storage_options" not in inspect.signature(LocalCache).parameters


def test_the_keys_are_obstores_and_the_mapping_is_the_callers(no_cloud_env: None) -> None:
    options = {"skip_signature": True, "endpoint": "http://127.0.0.1:9", "region": "eu-west-1"}
    store, prefix = open_store("s3://bucket/train/", storage_options=options)
    assert prefix == "train/"
    assert store.config["endpoint"] == "http://127.0.0.1:9"
    assert store.config["region"] == "eu-west-1"
    assert options == {
        "skip_signature": True,
        "endpoint": "http://127.0.0.1:9",
        "region": "eu-west-1",
    }  # read, not consumed
    # A source keeps its own copy: a later change to the caller's dict changes nothing.
    location = StoreLocation("s3://bucket/train/", options)
    options["endpoint"] = "http://127.0.0.1:10"
    assert location.store.config["endpoint"] == "http://127.0.0.1:9"


def test_options_with_a_store_object_are_refused() -> None:
    store, _ = open_store("memory:///")
    with pytest.raises(TypeError, match=r"storage_options \['region'\] were given with a store"):
        ObjectDataset(store, ["a"], storage_options={"region": "x"})
    assert asyncio.run(ObjectDataset(store, ["a"], storage_options={}).listing().collect()) == []
