"""torch's "excessive worker creation" warning: more workers than this process's CPUs."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from aioload import ArrayDataset, DataLoader

CPUS = len(os.sched_getaffinity(0))


def test_more_workers_than_cpus_warns_at_construction_pointing_at_the_users_line() -> None:
    with pytest.warns(UserWarning, match="excessive worker creation") as caught:
        DataLoader(ArrayDataset(np.arange(4)), num_workers=CPUS + 1)
    (warning,) = [w for w in caught if "excessive" in str(w.message)]
    assert warning.filename == __file__
    assert f"will create {CPUS + 1} worker processes in total" in str(warning.message)
    assert f"suggested max number of worker in current system is {CPUS}," in str(warning.message)


def test_and_again_at_every_iteration() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DataLoader(ArrayDataset(np.arange(4)), batch_size=2, num_workers=CPUS + 1)
    with pytest.warns(UserWarning, match="excessive worker creation") as caught:
        assert len(list(loader)) == 2
    assert any(w.filename == __file__ for w in caught)


def test_as_many_workers_as_cpus_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = DataLoader(ArrayDataset(np.arange(4)), batch_size=2, num_workers=min(CPUS, 2))
        assert len(list(loader)) == 2


def test_the_same_message_as_torch() -> None:
    torch = pytest.importorskip("torch")
    with pytest.warns(UserWarning) as theirs:
        torch.utils.data.DataLoader(list(range(4)), num_workers=CPUS + 1)
    with pytest.warns(UserWarning) as ours:
        DataLoader(ArrayDataset(np.arange(4)), num_workers=CPUS + 1)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
