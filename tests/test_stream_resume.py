"""Stream resumes as a property, for every stream format (tar shards, JSON lines, Parquet).

Whatever the world size (1 to 4), the workers before and after (0 to 3) and the batch each
rank stopped after, the ranks that resume yield exactly what was left, each sample once
(:mod:`tests.resume_property`): a rank resumed from its own state with other workers, and
a job of another size resumed from every rank's states merged. The unmarked tests are the
known hard cases; the grid of random examples is slow.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aioload.sources.streams.state import ShardStateError
from tests.resume_property import (
    Format,
    check_resume,
    loader,
    numbers,
    resumed,
    stop_after,
    write_jsonl,
    write_parquet,
    write_tar,
)

pytest.importorskip("pyarrow")

FORMATS = ["tar", "jsonl", "parquet"]


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Format]:
    root = tmp_path_factory.mktemp("streams")
    made = [write_tar(root / "tar"), write_jsonl(root / "jsonl"), write_parquet(root / "pq")]
    assert all(fmt.total == 43 for fmt in made)
    return {fmt.name: fmt for fmt in made}


def split_options(fmt: Format, sized: bool) -> dict[str, Any]:
    """``split=`` for the format's sized split (or its whole one), where it has a choice."""
    if len(fmt.splits) == 1:
        return {}
    return {"split": fmt.splits[1] if sized else fmt.splits[0]}


@pytest.mark.parametrize(
    ("name", "sized"),
    [("tar", False), ("tar", True), ("jsonl", False), ("parquet", False), ("parquet", True)],
)
def test_a_rank_resumes_its_own_state_with_other_workers(
    formats: dict[str, Format], name: str, sized: bool
) -> None:
    # Two ranks, each resumed from its own state with another num_workers: the re-split
    # shares the rank's leftovers over its workers (they were never the others' too).
    fmt = formats[name]
    options = {**split_options(fmt, sized), "shuffle_buffer": 4}
    check_resume(fmt, world_size=2, workers_before=2, workers_after=0, stops=[0.5, 0.4], **options)


@pytest.mark.parametrize("name", FORMATS)
def test_a_rank_resumes_its_own_state_without_workers_from_a_new_layout(
    formats: dict[str, Format], name: str
) -> None:
    # Another layout without any worker: three ranks, resumed with another shuffle buffer.
    fmt = formats[name]
    whole = split_options(fmt, sized=False)
    rest = []
    for rank in range(3):
        before = fmt.dataset(rank, 3, shuffle_buffer=3, **whole)
        taken, state = stop_after(loader(before, 0), 2)
        full = numbers(list(loader(fmt.dataset(rank, 3, shuffle_buffer=3, **whole), 0)))
        got = resumed(loader(fmt.dataset(rank, 3, **whole), 0), state)
        assert Counter(got) == Counter(full) - Counter(taken), rank
        rest += got
    assert len(rest) == len(set(rest))


@pytest.mark.parametrize(
    ("world_size", "new_world_size", "sized", "drop_last"),
    [(2, 3, False, False), (3, 1, True, False), (2, 4, True, True), (4, 2, True, False)],
)
@pytest.mark.parametrize("name", FORMATS)
def test_a_job_of_another_size_resumes_every_rank_merged(
    formats: dict[str, Format],
    name: str,
    world_size: int,
    new_world_size: int,
    sized: bool,
    drop_last: bool,
) -> None:
    fmt = formats[name]
    options = split_options(fmt, sized)
    if len(fmt.splits) > 1 and sized:
        options["drop_last"] = drop_last  # else padded: a sample left twice comes once
    stops = [0.3, 0.7, 0.5, 0.9][:world_size]
    check_resume(
        fmt,
        world_size=world_size,
        workers_before=0,
        workers_after=0,
        stops=stops,
        new_world_size=new_world_size,
        shuffle_buffer=4,
        **options,
    )


@pytest.mark.parametrize("name", FORMATS)
def test_a_merge_counts_a_rank_not_started_and_a_rank_done(
    formats: dict[str, Format], name: str
) -> None:
    # Rank 0 stopped mid-epoch, rank 1 had not started, rank 2 had ended its epoch.
    fmt = formats[name]
    whole = split_options(fmt, sized=False)
    taken, running = stop_after(loader(fmt.dataset(0, 3, **whole), 0), 3)
    fresh = loader(fmt.dataset(1, 3, **whole), 0).state_dict()
    done_loader = loader(fmt.dataset(2, 3, **whole), 0)
    done = numbers(list(done_loader))
    ended = json.loads(json.dumps(done_loader.state_dict()))
    assert not fresh["in_progress"] and not ended["in_progress"]
    states = [running, fresh, ended]
    rest = []
    for rank in range(2):
        data = fmt.dataset(rank, 2, **whole)
        rest += resumed(loader(data, 0), json.loads(json.dumps(data.merge_states(states))))
    assert sorted(taken + done + rest) == list(range(fmt.total))


@pytest.mark.parametrize("name", FORMATS)
def test_a_state_of_another_rank_is_refused(formats: dict[str, Format], name: str) -> None:
    # Rank 1's leftovers loaded by rank 0 of the same job would lose rank 0's.
    fmt = formats[name]
    _, state = stop_after(loader(fmt.dataset(1, 2), 0), 2)
    with pytest.raises(ShardStateError, match=r"of rank\(s\) 1 of 2, this dataset is rank 0 of 2"):
        loader(fmt.dataset(0, 2), 2).load_state_dict(state)
    with pytest.raises(ShardStateError, match="merge_states"):
        fmt.dataset(0, 2).load_state_dict(state["dataset"])


STOPS = st.lists(st.floats(0, 1), min_size=4, max_size=4)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 cores
@pytest.mark.parametrize("name", FORMATS)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    world_size=st.integers(1, 4),
    new_world_size=st.none() | st.integers(1, 4),
    workers_before=st.integers(0, 3),
    workers_after=st.integers(0, 3),
    stops=STOPS,
    sized=st.booleans(),
    drop_last=st.booleans(),
    shuffle_buffer=st.sampled_from([0, 5]),
    shuffle_units=st.booleans(),
    in_flight=st.integers(1, 2),
)
@example(  # a rank's own state, two workers to one: the re-split took a rank share again
    world_size=2,
    new_world_size=None,
    workers_before=2,
    workers_after=1,
    stops=[0.5, 0.5, 0, 0],
    sized=True,
    drop_last=False,
    shuffle_buffer=5,
    shuffle_units=False,
    in_flight=1,
)
@example(  # every rank merged into a job of another size, with workers both sides
    world_size=3,
    new_world_size=2,
    workers_before=3,
    workers_after=2,
    stops=[0.2, 1.0, 0.6, 0],
    sized=True,
    drop_last=False,
    shuffle_buffer=5,
    shuffle_units=True,
    in_flight=2,
)
@example(  # no rank had begun: a job of another size starts its own epoch
    world_size=1,
    new_world_size=2,
    workers_before=0,
    workers_after=0,
    stops=[0, 0, 0, 0],
    sized=True,
    drop_last=False,
    shuffle_buffer=0,
    shuffle_units=False,
    in_flight=1,
)
def test_any_resume_yields_what_was_left_once(
    formats: dict[str, Format],
    name: str,
    world_size: int,
    new_world_size: int | None,
    workers_before: int,
    workers_after: int,
    stops: list[float],
    sized: bool,
    drop_last: bool,
    shuffle_buffer: int,
    shuffle_units: bool,
    in_flight: int,
) -> None:
    fmt = formats[name]
    options: dict[str, Any] = {**split_options(fmt, sized), fmt.shuffle: shuffle_units}
    if len(fmt.splits) > 1:
        options["drop_last"] = drop_last
    if fmt.in_flight is not None:
        options[fmt.in_flight] = in_flight
    check_resume(
        fmt,
        world_size=world_size,
        workers_before=workers_before,
        workers_after=workers_after,
        stops=stops,
        new_world_size=new_world_size,
        shuffle_buffer=shuffle_buffer,
        **options,
    )
