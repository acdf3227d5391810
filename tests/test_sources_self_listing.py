"""A dataset that lists itself: ``DataLoader(ObjectDataset(url))`` and ``default_sampler``.

Against SeaweedFS (a real S3 server: paginated listings) and the local filesystem.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from servers import object_bytes
from test_sources_objects import decode_number, put_objects

from aioload import DataLoader, RandomSampler, SequentialSampler
from aioload.sources import ObjectDataset, ObjectListing, ShuffledListing

KEYS = [f"{i:04d}.bin" for i in range(45)]


def number(data: Any) -> int:
    """An object's number (module level: decoded in the workers)."""
    return int.from_bytes(bytes(data[:4]), "little")


def numbers(loader: DataLoader) -> list[int]:
    return [n for batch in loader for n in batch]


@pytest.fixture
def listed(s3_prefix: str, s3_storage_options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    asyncio.run(put_objects(s3_prefix, s3_storage_options, KEYS))
    return s3_prefix, s3_storage_options


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_over_a_dataset_without_keys_lists_it(
    listed: tuple[str, dict[str, Any]], workers: int
) -> None:
    url, options = listed
    dataset = ObjectDataset(url, decode=number, storage_options=options)
    loader = DataLoader(dataset, batch_size=8, num_workers=workers, collate_fn=list)
    assert isinstance(loader.sampler, ObjectListing)
    assert numbers(loader) == list(range(45))  # the store's (lexicographic) order
    with pytest.raises(TypeError, match=r"default_sampler\(\) offered has none"):
        len(loader)
    with pytest.raises(ValueError, match="sampler has no length"):
        DataLoader(dataset, batch_size=8, on_error="skip", max_skipped=0.1)


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_collects_the_listing_and_reshuffles_every_epoch(
    listed: tuple[str, dict[str, Any]], workers: int
) -> None:
    url, options = listed
    dataset = ObjectDataset(url, decode=decode_number, storage_options=options)
    loader = DataLoader(
        dataset, batch_size=8, shuffle=True, generator=7, num_workers=workers, collate_fn=list
    )
    assert isinstance(loader.sampler, ShuffledListing)
    first = [n for n, _ in numbers(loader)]
    second = [n for n, _ in numbers(loader)]
    assert sorted(first) == sorted(second) == list(range(45))
    assert first != list(range(45)) and second != first
    again = DataLoader(dataset, batch_size=8, shuffle=True, generator=7, collate_fn=list)
    assert [n for n, _ in numbers(again)] == first  # a seeded loader is reproducible


@pytest.mark.parametrize(
    ("shuffle", "generator"),
    [(False, 3), (True, 3), (True, None)],
    ids=["listed", "seeded", "unseeded"],
)
@pytest.mark.parametrize("epoch", [0, 1])
def test_a_self_listed_loader_resumes_its_epoch(
    listed: tuple[str, dict[str, Any]], shuffle: bool, generator: int | None, epoch: int
) -> None:
    url, options = listed

    def loader() -> DataLoader:
        dataset = ObjectDataset(url, decode=number, storage_options=options)
        return DataLoader(
            dataset, batch_size=4, shuffle=shuffle, generator=generator, collate_fn=list
        )

    original = loader()
    for _ in range(epoch):
        numbers(original)
    iterator = iter(original)
    taken = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(original.state_dict()))
    rest = [n for batch in iterator for n in batch]
    resumed = loader()
    resumed.load_state_dict(state)
    assert numbers(resumed) == rest
    assert sorted([n for batch in taken for n in batch] + rest) == list(range(45))
    # The epochs after it are the original's.
    assert numbers(resumed) == numbers(original)


def test_a_shuffled_resume_refuses_a_listing_that_changed(
    listed: tuple[str, dict[str, Any]],
) -> None:
    url, options = listed

    def loader() -> DataLoader:
        dataset = ObjectDataset(url, decode=number, storage_options=options)
        return DataLoader(dataset, batch_size=4, shuffle=True, generator=3, collate_fn=list)

    original = loader()
    numbers(original)  # epoch 0: the listing is collected
    iterator = iter(original)
    next(iterator)
    state = original.state_dict()
    iterator.close()
    asyncio.run(put_objects(url, options, [*KEYS, "9999.bin"]))  # one object more
    resumed = loader()
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match=r"now lists 46 keys, not the 45"):
        numbers(resumed)


def test_keys_given_keep_the_loaders_own_samplers(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"{i}.bin").write_bytes(object_bytes(i))
    dataset = ObjectDataset(tmp_path.as_uri(), [f"{i}.bin" for i in range(6)], decode=number)
    assert dataset.default_sampler(shuffle=True, generator=None) is None
    assert isinstance(DataLoader(dataset).sampler, SequentialSampler)
    shuffled = DataLoader(dataset, batch_size=2, shuffle=True, collate_fn=list)
    assert isinstance(shuffled.sampler, RandomSampler) and len(shuffled) == 3
    assert sorted(numbers(shuffled)) == list(range(6))
    # Without keys, over the local filesystem: listed, and shuffled on demand.
    listed = ObjectDataset(tmp_path.as_uri(), decode=number)
    assert sorted(numbers(DataLoader(listed, batch_size=4, collate_fn=list))) == list(range(6))
    shuffled = DataLoader(listed, batch_size=4, shuffle=True, generator=1, collate_fn=list)
    assert sorted(numbers(shuffled)) == list(range(6))


class Offering:
    """A map-style dataset that offers a sampler of its own."""

    def __init__(self, offer: Any) -> None:
        self.offer = offer
        self.asked: list[tuple[bool, Any]] = []

    def __getitem__(self, key: int) -> int:
        return key * 10

    def default_sampler(self, shuffle: bool, generator: Any) -> Any:
        self.asked.append((shuffle, generator))
        return self.offer


class Odd:
    """Yields 1, 3, 5 (a sampler without a length)."""

    def __iter__(self) -> Iterator[int]:
        return iter([1, 3, 5])


def test_the_default_sampler_protocol() -> None:
    dataset = Offering(Odd())
    loader = DataLoader(dataset, batch_size=2, shuffle=True, generator=5)
    assert [batch.tolist() for batch in loader] == [[10, 30], [50]]
    ((shuffle, generator),) = dataset.asked
    assert shuffle is True and isinstance(generator, np.random.Generator)  # checked first
    with pytest.raises(TypeError, match=r"Offering\.default_sampler"):
        len(loader)
    # None: the loader's own default (which needs a length here: the dataset has none).
    with pytest.raises(TypeError):
        list(DataLoader(Offering(None)))
    # Given samplers win: default_sampler is not asked.
    explicit = Offering(Odd())
    assert list(DataLoader(explicit, sampler=[0, 2], batch_size=None)) == [0, 20]
    assert list(DataLoader(explicit, batch_sampler=[[4]])) == [np.array([40])]
    assert explicit.asked == []
    with pytest.raises(TypeError, match="should return a sampler"):
        DataLoader(Offering(42))
