"""Hypothesis strategies the fuzz tests of outside data share."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**64) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)
"""Any JSON-like value, small: what a corrupted checkpoint field may hold instead."""
