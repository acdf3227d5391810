"""Stream states that lie are refused before anything is read, for every stream format.

A checkpoint is outside data. Real mid-epoch states of each format (tar shards split by
shards and by samples, JSON lines, Parquet), changed: a sample named twice, ranges that
overlap, bytes out of order, rows or samples the files do not have, a buffer larger than
its layout's, or any JSON in any field. Either the dataset refuses the state with its
``ShardStateError``, or the stream it resumes yields samples of the dataset, each once.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioload.errors import TarFormatError
from aioload.sources.streams.state import ShardStateError, check_state
from tests.resume_property import (
    Format,
    loader,
    stop_after,
    write_jsonl,
    write_parquet,
    write_tar,
)
from tests.strategies import JSON_VALUES

pytest.importorskip("pyarrow")

KINDS = ["tar-shards", "tar-samples", "jsonl", "parquet"]
PREFIX = {"parquet": "Parquet stream state: "}


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Format]:
    root = tmp_path_factory.mktemp("states")
    made = [write_tar(root / "tar"), write_jsonl(root / "jsonl"), write_parquet(root / "pq")]
    return {fmt.name: fmt for fmt in made}


OPTIONS: dict[str, dict[str, Any]] = {
    "tar-shards": {"split": "shards", "shuffle_buffer": 4, "shards_in_flight": 2},
    "tar-samples": {"split": "samples", "shuffle_buffer": 4, "shards_in_flight": 2},
    "jsonl": {"shuffle_buffer": 4, "files_in_flight": 2},
    "parquet": {"shuffle_buffer": 6},
}


def build(formats: dict[str, Format], kind: str) -> Callable[[], Any]:
    fmt = formats[kind.partition("-")[0]]
    return lambda: fmt.dataset(0, 1, **OPTIONS[kind])


@pytest.fixture(scope="module")
def states(formats: dict[str, Format]) -> dict[str, dict[str, Any]]:
    """A real stream state of each kind, mid-epoch, its shuffle buffer full."""
    found = {}
    for kind in KINDS:
        _, state = stop_after(loader(build(formats, kind)(), 0), 4)
        stream = state["dataset"]
        assert stream["buffer"], kind
        found[kind] = stream
    return found


def sample_number(sample: Any) -> int:
    return int(sample["id"]) if isinstance(sample, dict) else int(sample)


async def _read(dataset: Any) -> list[int]:
    return [sample_number(sample) async for sample in dataset]


def refused_or_once(dataset: Any, state: Any, total: int, prefix: str) -> bool:
    """Loads ``state``: True if refused; else the stream resumed yields samples of the
    dataset, each once, or fails loudly while reading (a state of other files)."""
    try:
        dataset.load_state_dict(state)
    except ShardStateError as error:
        assert str(error).startswith(prefix), error
        return True
    try:
        got = asyncio.run(_read(dataset))
    except (ShardStateError, TarFormatError, OSError) as error:
        # Bytes the state names that are no sample where it says: found reading them.
        assert "state" in str(error) or isinstance(error, TarFormatError | OSError), error
        return False
    assert len(got) == len(set(got)), sorted(got)
    assert set(got) <= set(range(total))
    return False


# -- lies that are refused, whatever the format -------------------------------------------


def _lists(state: dict[str, Any]) -> list[str]:
    return [name for name in ("runs", "buffer", "ready") if name in state]


@pytest.mark.parametrize("kind", KINDS)
def test_a_sample_named_twice_is_refused(
    formats: dict[str, Format], states: dict[str, dict[str, Any]], kind: str
) -> None:
    # 500 rows yielded of 200 distinct: an entry repeated, or a buffered one also a run.
    state = states[kind]
    lies = [
        {**state, name: [*state[name], entry]} for name in _lists(state) for entry in state[name]
    ]
    for ref in state["buffer"]:
        run = ref if kind == "parquet" else [ref[0], ref[1], ref[2], ref[1] + 1]
        lies.append({**state, "runs": [*state["runs"], run]})
    for lie in lies:
        with pytest.raises(ShardStateError, match="twice"):
            build(formats, kind)().load_state_dict(lie)


@pytest.mark.parametrize("kind", KINDS)
def test_workers_of_one_rank_naming_a_sample_twice_between_them_are_refused(
    formats: dict[str, Format], states: dict[str, dict[str, Any]], kind: str
) -> None:
    # Each state alone is sound; two workers of the rank both hold the same leftovers.
    state = states[kind]
    twins = [
        {**state, "layout": {**state["layout"], "worker": worker, "num_workers": 2}}
        for worker in range(2)
    ]
    data = build(formats, kind)()
    for twin in twins:
        data.load_state_dict(twin)
    with pytest.raises(ShardStateError, match="twice"):
        data.resume_streams(twins, 1, None)


def test_a_row_group_asked_for_ten_thousand_times_is_refused_at_once(
    formats: dict[str, Format], states: dict[str, dict[str, Any]]
) -> None:
    # A few hundred KB of JSON asking to read one row group 10_000 times over at once.
    state = states["parquet"]
    lie = {**state, "buffer": [[3, 0, 12]] * 10_000}  # row group 3 has 12 rows
    data = build(formats, "parquet")()
    began = time.monotonic()
    with pytest.raises(ShardStateError, match="overlap"):
        data.load_state_dict(lie)
    assert time.monotonic() - began < 5


@pytest.mark.parametrize("kind", ["tar-samples", "parquet"])
def test_samples_that_do_not_exist_are_refused(
    formats: dict[str, Format], states: dict[str, dict[str, Any]], kind: str
) -> None:
    state = states[kind]
    run = state["runs"][-1]
    past = [run[0], run[1], *run[2:-1], run[-1] + 1 if run[-1] != -1 else 10**6]
    with pytest.raises(ShardStateError):
        build(formats, kind)().load_state_dict({**state, "runs": [*state["runs"][:-1], past]})


def test_a_sample_at_another_byte_than_its_index_says_is_refused(
    formats: dict[str, Format], states: dict[str, dict[str, Any]]
) -> None:
    state = states["tar-samples"]
    at, (shard, start, offset, stop) = next(
        (i, run) for i, run in enumerate(state["runs"]) if 0 < run[1] < run[3]
    )
    runs = list(state["runs"])
    runs[at] = [shard, start, offset + 512, stop]  # in order with its neighbours still
    with pytest.raises(ShardStateError, match="other shards"):
        build(formats, "tar-samples")().load_state_dict({**state, "runs": runs})


@pytest.mark.parametrize("kind", ["tar-shards", "tar-samples", "jsonl"])
def test_bytes_out_of_order_are_refused(
    formats: dict[str, Format], states: dict[str, dict[str, Any]], kind: str
) -> None:
    # A buffered sample placed after a later one's bytes, its position unchanged.
    state = states[kind]
    ref = max(state["buffer"], key=lambda ref: ref[1])
    later = [r for r in state["runs"] if r[0] == ref[0] and r[1] > ref[1]]
    runs = state["runs"] if later else [*state["runs"], [ref[0], ref[1] + 1, ref[3], -1]]
    shift = 512 * 100
    lie = {
        **state,
        "runs": runs,
        "buffer": [
            [r[0], r[1], r[2] + shift, r[3] + shift, r[4]] if r == ref else r
            for r in state["buffer"]
        ],
    }
    with pytest.raises(ShardStateError, match=r"cannot come after|overlap"):
        build(formats, kind)().load_state_dict(lie)


def test_a_tar_sample_off_its_block_is_refused(
    formats: dict[str, Format], states: dict[str, dict[str, Any]]
) -> None:
    state = states["tar-shards"]
    ref = next(ref for ref in state["buffer"] if ref[1] > 0)
    off = [ref[0], ref[1], ref[2] + 1, ref[3], ref[4]]
    lie = {**state, "buffer": [off if r == ref else r for r in state["buffer"]]}
    with pytest.raises(ShardStateError, match="block"):
        build(formats, "tar-shards")().load_state_dict(lie)


@pytest.mark.parametrize("kind", KINDS)
def test_a_buffer_larger_than_its_layout_holds_is_refused(
    formats: dict[str, Format], states: dict[str, dict[str, Any]], kind: str
) -> None:
    state = states[kind]
    layout = {**state["layout"], "shuffle_buffer": len(state["buffer"]) - 1}
    with pytest.raises(ShardStateError, match="holds"):
        build(formats, kind)().load_state_dict({**state, "layout": layout})


def test_the_bound_is_the_layouts_shuffle_buffer() -> None:
    refs = [[0, n, 512 * n, 512 * (n + 1), f"{n:06d}"] for n in range(5)]
    state = {
        "format": "aioload.shard-stream",
        "version": 1,
        "shards": 1,
        "epoch": 0,
        "layout": {"shuffle_buffer": 5},
        "runs": [[0, 5, 2560, -1]],
        "buffer": refs,
        "draining": False,
        "rng": None,
    }
    assert len(check_state(state, shards=1).buffer) == 5
    for size in (4, 1, 0):
        with pytest.raises(ShardStateError, match=r"holds 5 samples"):
            check_state({**state, "layout": {"shuffle_buffer": size}}, shards=1)
    with pytest.raises(ShardStateError, match="shuffle_buffer"):
        check_state({**state, "layout": {"shuffle_buffer": True}}, shards=1)


# -- any change at all ----------------------------------------------------------------------


@st.composite
def changed(draw: st.DrawFn, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with one change: a field's value, an entry repeated, dropped or added, or a
    number in an entry replaced (near its value, or anything)."""
    state = copy.deepcopy(state)
    lists = _lists(state)
    how = draw(st.sampled_from(["field", "repeat", "drop", "add", "number"]))
    if how == "field":
        state[draw(st.sampled_from(sorted(state)))] = draw(JSON_VALUES)
        return state
    name = draw(st.sampled_from(lists))
    entries = state[name]
    if how == "add" or not entries:
        width = len(entries[0]) if entries else 4
        entries.append(draw(st.lists(st.integers(-1, 5000), min_size=width, max_size=width)))
        return state
    at = draw(st.integers(0, len(entries) - 1))
    if how == "repeat":
        entries.insert(draw(st.integers(0, len(entries))), copy.deepcopy(entries[at]))
    elif how == "drop":
        del entries[at]
    else:
        entry = entries[at]
        part = draw(st.integers(0, len(entry) - 1))
        near = entry[part] if isinstance(entry[part], int) else 0
        entry[part] = draw(st.integers(near - 600, near + 600) | st.integers(-1, 2**64))
    return state


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_changed_state_is_refused_or_resumes_each_sample_once(
    formats: dict[str, Format],
    states: dict[str, dict[str, Any]],
    kind: str,
    data: st.DataObject,
) -> None:
    state = data.draw(changed(states[kind]))
    total = formats[kind.partition("-")[0]].total
    json.dumps(state)
    refused_or_once(build(formats, kind)(), state, total, PREFIX.get(kind, "shard stream state: "))


@pytest.mark.parametrize("kind", KINDS)
def test_the_real_states_resume(
    formats: dict[str, Format], states: dict[str, dict[str, Any]], kind: str
) -> None:
    assert not refused_or_once(build(formats, kind)(), states[kind], 43, "")
