"""convert.sort_keys / sorted_unique: the sorts under every COO -> format build, against
torch's own sort and unique (the oracle), on both of sort_keys' routes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scorch import convert

keys = st.lists(st.integers(0, 2**40), max_size=300).map(lambda v: torch.tensor(v, dtype=torch.int64))


@settings(max_examples=200, deadline=None)
@given(keys, st.sampled_from([1, 3, 2**12]))
def test_sort_keys_is_a_stable_sort(key, spread):
    """Few distinct keys (``key % spread``) make many ties: the order must keep them in entry order."""
    key = key % spread
    want_keys, want_order = torch.sort(key, stable=True)
    got_keys, got_order = convert.sort_keys(key, spread)
    assert got_keys.dtype == got_order.dtype == torch.int64
    assert torch.equal(got_keys, want_keys) and torch.equal(got_order, want_order)


@pytest.mark.parametrize("n,bound", [(10, 2**59), (10, 2**60 + 1), (5000, 2**50), (5000, 2**51 + 1)])
def test_sort_keys_past_the_packed_range_falls_back(n, bound):
    """Keys near the bound where index bits no longer fit (and just inside it) sort alike."""
    key = torch.randint(bound - 2 * n, bound, (n,), generator=torch.Generator().manual_seed(n))
    key[1::3] = key[::3][:key[1::3].numel()]                       # ties
    want_keys, want_order = torch.sort(key, stable=True)
    got_keys, got_order = convert.sort_keys(key, bound)
    assert torch.equal(got_keys, want_keys) and torch.equal(got_order, want_order)


@settings(max_examples=200, deadline=None)
@given(keys, st.sampled_from([1, 7, 2**41]))
def test_sorted_unique_matches_torch_unique(key, spread):
    key = key % spread
    got = convert.sorted_unique(key)
    assert got.dtype == torch.int64 and torch.equal(got, torch.unique(key))
