"""A ``bool`` where a count belongs is refused: ``True`` is an ``int`` to Python, and JSON
gives ``true`` back for a checkpoint field someone edited or wrote by hand. (MixDataset's
state fields: tests/test_mix.py.)"""

from __future__ import annotations

import pytest

from aioload.pipeline.checkpoint import check_worker_streams
from aioload.sources import ShardWriter


def test_a_checkpoint_whose_next_worker_is_a_bool_is_refused() -> None:
    check_worker_streams({"workers": [None, None], "next_worker": 1}, 2)
    with pytest.raises(ValueError, match="next worker's number"):
        check_worker_streams({"workers": [None, None], "next_worker": True}, 2)


def test_shard_writer_refuses_a_bool_maxcount(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="maxcount should be a positive int; got True"):
        ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=True)
