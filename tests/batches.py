"""Comparing batches made two ways: the fast path's against the plain one's."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same_batch(got: Any, expected: Any, *, layout: bool = True) -> None:
    """Same structure and types; arrays byte-identical with the same dtype and shape (and,
    with ``layout``, the same C-contiguity); an expected exception matched by type and
    message."""
    if isinstance(expected, BaseException):
        assert type(got) is type(expected) and str(got) == str(expected)
        return
    assert type(got) is type(expected)
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        if layout:
            assert got.flags.c_contiguous == expected.flags.c_contiguous
        assert got.tobytes() == expected.tobytes()
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same_batch(got[key], expected[key], layout=layout)
    elif isinstance(expected, list | tuple):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same_batch(a, b, layout=layout)
    else:
        assert got == expected
