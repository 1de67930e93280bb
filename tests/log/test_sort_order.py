"""grouping.sorted_distinct (how ids are ranked and told apart) against Python's
stable sort of the values' bytes, on text built to hit the corners of byte order: empty values,
prefixes of each other, NUL bytes, multi-byte UTF-8 (code point order, not a locale's), values
sharing a long prefix, duplicates, sliced arrays and every text type."""

from __future__ import annotations

import random
import uuid

import numpy as np
import pyarrow as pa
import pytest

from gaca_cli.log.grouping import sorted_distinct

POOL = [
    "",
    "a",
    "a\x00",
    "ab",
    "abcdefgh",
    "abcdefghi",
    "abcdefgh\x00",
    "é",
    "zz",
    "\U0001f600",
    "abcdefghabcdefgh",
    "abcdefghabcdefgh1",
    "\xff",
    "ÿ",
]


def random_values(rng: random.Random, n: int) -> list[str]:
    prefix = rng.choice(["", "run-2026-11-30-", "abcdefgh"])
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append(prefix + rng.choice(POOL))
        else:
            out.append(prefix + "".join(rng.choice("ab\x00é") for _ in range(rng.randint(0, 20))))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_matches_pyarrow(seed):
    rng = random.Random(seed)
    values = random_values(rng, rng.randint(0, 60))
    for typ in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        arr = pa.array(
            [v.encode() if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) else v for v in values], type=typ
        )
        if len(arr) > 2 and seed % 3 == 0:
            arr = arr.slice(1, len(arr) - 2)
        check(arr)


def check(arr: pa.Array) -> None:
    """The order is a stable sort by bytes (text as UTF-8), integers by value; `first` marks
    exactly the values that differ from the one before them in that order."""
    values = arr.to_pylist()
    key = (lambda i: values[i].encode()) if isinstance(next(iter(values), b""), str) else (lambda i: values[i])
    order, first = sorted_distinct(arr)
    assert order.tolist() == sorted(range(len(values)), key=key)
    np.testing.assert_array_equal(sorted_distinct(arr)[0], order)
    ordered = arr.take(pa.array(order)).to_pylist()
    assert first.tolist() == [i == 0 or ordered[i] != ordered[i - 1] for i in range(len(ordered))]


@pytest.mark.parametrize("kind", ["uuid", "structured", "int"])
def test_id_shapes(kind):
    """uuids, structured ids sharing most of their text, and integers."""
    rng = random.Random(7)
    if kind == "uuid":
        arr = pa.array([str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(5000)])
    elif kind == "structured":
        arr = pa.array([f"worker-{i % 4:02d}-traj-{rng.randrange(10**6):07d}" for i in range(5000)])
    else:
        arr = pa.array([rng.randrange(-50, 50) for _ in range(5000)])
    check(arr)
