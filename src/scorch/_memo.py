"""Bounded memo tables: the in-process caches keyed by call signatures (shapes, scalars).

A long run meets new keys for ever -- mini-batches of new sizes, an optimizer's per-step scalars --
so a table that stopped growing when full left every later key on its slow path, and one that never
stopped grew without bound.  :func:`remember` drops the oldest entry instead (dicts keep insertion
order: first in, first out)."""

from __future__ import annotations

LIMIT = 4096


def remember(table: dict, key, value):
    """``table[key] = value``, dropping the oldest entry when ``table`` holds :data:`LIMIT`;
    returns ``value``."""
    while len(table) >= LIMIT:   # (once per new entry, but for a LIMIT lowered meanwhile)
        try:
            del table[next(iter(table))]
        except (StopIteration, KeyError, RuntimeError):   # (another thread changed it meanwhile)
            break
    table[key] = value
    return value
