"""Every compiled loop (gaca_cli/credit/_kernels.py, gaca_cli/log/_kernels.py) against the
numpy definition it stands in for (estimators.py, step_groups.py, summary.py), bit for bit.

The kernels promise the same floating-point operations in the same order as the numpy code,
so float results are compared bit for bit: equal NaN positions and equal bits everywhere else
(so -0.0 ≠ 0.0). Where the numpy definition is itself built from a sort or a gather, a plain
Python loop is checked as well (discounted returns, step groups by hash, per-trajectory sums).
Kernels that walk trajectories through `rows` (each trajectory's rows in step order) are also
run with the rows moved to other places in the file, and must give the same value per row.

Inputs are seeded random arrays of several shapes plus the edge cases (empty input, unused
codes, singleton and constant groups, groups above the insertion-sort threshold, ties, values
1e9 + k·1e-3, values ~1e300 whose squares overflow, ±inf/NaN), and Hypothesis for the
moments, normalisation and standardisation (derandomized, no example database).

The library functions run their numpy code here (GACA_KERNELS=0, set for every test); the
kernels are called directly, with the dtypes the library passes (float64, int64, uint64
hashes), so their on-disk compile cache is reused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gaca_cli.credit import _kernels as kernels
from gaca_cli.credit import estimators, step_groups, summary
from gaca_cli.credit._compiled import ENV
from gaca_cli.credit.config import EPS, Z_STD_FLOOR
from gaca_cli.log.index import TrajectoryIndex
from tests.conftest import EXAMPLE_LOG

HYPOTHESIS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


SEEDS = range(6)
SIZES = (0, 1, 2, 7, 60, 400)


@pytest.fixture(autouse=True)
def numpy_definitions(monkeypatch):
    """The library's functions compute with their numpy code, whatever the input's size."""
    monkeypatch.setenv(ENV, "0")


def assert_bits(actual: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Same shape and dtype, NaN at the same positions, identical bits everywhere else."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, what
    assert actual.dtype == expected.dtype == np.float64, what
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    bad = np.flatnonzero(nan_a != nan_e)
    assert len(bad) == 0, f"{what}: NaN differs at {bad[:5]}: {actual[bad[:5]]} vs {expected[bad[:5]]}"
    keep = ~nan_a
    differ = np.flatnonzero(actual[keep].view(np.int64) != expected[keep].view(np.int64))
    if len(differ):
        where = np.flatnonzero(keep)[differ[:5]]
        raise AssertionError(f"{what}: bits differ at {where}: {actual[where]!r} vs {expected[where]!r}")


def make_index(
    traj_start: np.ndarray,
    traj_len: np.ndarray,
    order: np.ndarray | None = None,
    traj_group: np.ndarray | None = None,
    canonical_traj_order: np.ndarray | None = None,
) -> TrajectoryIndex:
    """A row index over contiguous trajectories; `order` (position -> file row, default the
    identity), each trajectory's episode group (default one group) and the canonical order of
    the trajectories (default their code order)."""
    n_traj = len(traj_len)
    n = int(traj_len.sum())
    order = np.arange(n, dtype=np.int64) if order is None or len(order) == 0 else order
    traj_group = np.zeros(n_traj, dtype=np.int64) if traj_group is None else traj_group
    canon = np.arange(n_traj, dtype=np.int64) if canonical_traj_order is None else canonical_traj_order
    canonical_start = np.empty(n_traj, dtype=np.int64)
    canonical_start[canon] = np.cumsum(traj_len[canon]) - traj_len[canon]
    row_traj = np.empty(n, dtype=np.int64)
    row_traj[order] = np.repeat(np.arange(n_traj, dtype=np.int64), traj_len)
    n_groups = int(traj_group.max()) + 1 if n_traj else 0
    return TrajectoryIndex(order, traj_start, traj_len, traj_group, n_groups, canonical_start, row_traj)


def loop_discounted_returns(reward, traj_start, traj_len, gamma) -> np.ndarray:
    """The plain loop: backwards within each trajectory."""
    out = np.empty_like(reward)
    for a, n in zip(traj_start.tolist(), traj_len.tolist()):
        g = None
        for i in range(a + n - 1, a - 1, -1):
            g = reward[i] if g is None else reward[i] + gamma * g
            out[i] = g
    return out


# ------------------------------------------------------------------------------ inputs

KINDS = ("normal", "ties", "near_1e9", "huge", "signed_zero", "mixed_scale")


def random_values(rng: np.random.Generator, m: int, kind: str) -> np.ndarray:
    if kind == "normal":
        return rng.normal(size=m)
    if kind == "ties":
        return rng.integers(-2, 3, size=m).astype(np.float64) * 0.5
    if kind == "near_1e9":  # shifted sums keep the 1e-3 steps exact
        return 1e9 + rng.integers(0, 20, size=m) * 1e-3
    if kind == "huge":  # squares overflow: the scale branch
        return rng.choice([-1.0, 1.0], size=m) * rng.uniform(1e299, 1e301, size=m)
    if kind == "signed_zero":
        return rng.choice([0.0, -0.0, 1.0, -1.0], size=m)
    return rng.normal(size=m) * 10.0 ** rng.integers(-8, 9, size=m)


def random_codes(rng: np.random.Generator, m: int, n_codes: int) -> np.ndarray:
    """Codes in 0..n_codes−1 with uneven group sizes (some large, some empty)."""
    if m == 0 or n_codes == 0:
        return np.zeros(m, dtype=np.int64)
    weights = rng.exponential(size=n_codes) ** 2
    weights[rng.random(n_codes) < 0.2] = 0.0  # unused codes
    if weights.sum() == 0:
        weights[0] = 1.0
    return rng.choice(n_codes, size=m, p=weights / weights.sum()).astype(np.int64)


def grouped_cases():
    """(seed, m, n_codes, kind): several shapes, few codes (large groups) and many."""
    for seed in SEEDS:
        for m in SIZES:
            n_codes = [1, 3, 40][seed % 3] if m else [0, 1, 5][seed % 3]
            yield seed, m, n_codes, KINDS[seed % len(KINDS)]
    for kind in KINDS:
        yield 100, 300, 4, kind  # groups far above kernels._SMALL


GROUPED = list(grouped_cases())


def make_grouped(seed, m, n_codes, kind):
    rng = np.random.default_rng(seed * 1000 + m)
    codes = random_codes(rng, m, max(n_codes, 1)) if n_codes else np.zeros(0, dtype=np.int64)
    return random_values(rng, m, kind), codes


# ------------------------------------------------------------------------------ discounted_returns


def kindex(start: np.ndarray, length: np.ndarray, rows: np.ndarray | None = None) -> kernels.Index:
    """The kernels' index over contiguous trajectories, walked through `rows` (default: in place)."""
    return kernels.Index.of(make_index(start, length, rows))


def in_file(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`values` (one per index position) moved to the file rows `rows` (position -> row)."""
    out = np.empty_like(values)
    out[rows] = values
    return out


def trajectories(rng: np.random.Generator, n_traj: int, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(traj code of each row, start, length) for contiguous trajectories of ≥ 1 step."""
    length = rng.integers(1, max_len + 1, size=n_traj).astype(np.int64)
    start = np.cumsum(length) - length
    traj = np.repeat(np.arange(n_traj, dtype=np.int64), length)
    return traj, start, length


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("seed,n_traj,max_len", [(0, 0, 1), (1, 1, 1), (2, 5, 1), (3, 1, 50), (4, 30, 8), (5, 200, 40)])
def test_discounted_returns_matches_numpy(seed, n_traj, max_len, gamma):
    rng = np.random.default_rng(seed)
    traj, start, length = trajectories(rng, n_traj, max_len)
    index = make_index(start, length)
    for kind in KINDS:
        reward = random_values(rng, len(traj), kind)
        got = kernels.discounted_returns(reward, kindex(start, length), gamma)
        with np.errstate(all="ignore"):
            expected = loop_discounted_returns(reward, start, length, gamma)
        assert_bits(got, estimators.discounted_returns(reward, index, gamma), f"{kind} vs numpy")
        assert_bits(got, expected, f"{kind} vs loop")
        # the same rows in another order, walked through `rows`: the same values per row
        rows = rng.permutation(len(reward)).astype(np.int64)
        moved = in_file(reward, rows)
        assert_bits(kernels.discounted_returns(moved, kindex(start, length, rows), gamma)[rows], got, "rows")
        assert_bits(
            estimators.discounted_returns(moved, make_index(start, length, rows), gamma)[rows], got, "numpy rows"
        )


def test_discounted_returns_edges():
    """γ = 0 gives the rewards; γ = 1 the suffix sums; one-step trajectories their reward;
    an overflowing suffix sum gives inf exactly as numpy does."""
    reward = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    start, length = np.array([0, 3, 4], dtype=np.int64), np.array([3, 1, 1], dtype=np.int64)
    assert_bits(kernels.discounted_returns(reward, kindex(start, length), 0.0), reward)
    assert_bits(kernels.discounted_returns(reward, kindex(start, length), 1.0), np.array([6.0, 5.0, 3.0, 4.0, 5.0]))
    huge = np.array([1e308, 1e308, 1e308])
    one = np.array([0], dtype=np.int64)
    three = np.array([3], dtype=np.int64)
    got = kernels.discounted_returns(huge, kindex(one, three), 1.0)
    assert_bits(got, estimators.discounted_returns(huge, make_index(one, three), 1.0))
    assert got.tolist() == [np.inf, np.inf, 1e308]


# ------------------------------------------------------------------------------ group_order


def check_group_order(codes: np.ndarray, values: np.ndarray, n_codes: int) -> None:
    order, count = kernels.group_order(codes, values, n_codes)
    m = len(codes)
    assert order.dtype == count.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(m))  # a permutation
    np.testing.assert_array_equal(count, np.bincount(codes, minlength=n_codes))
    assert np.all(np.diff(codes[order]) >= 0)  # grouped, groups in code order
    vs, cs = values[order], codes[order]
    same_group = cs[1:] == cs[:-1]
    assert np.all(vs[1:][same_group] >= vs[:-1][same_group])  # ascending within a group
    bounds = np.cumsum(count)
    for c in range(n_codes):  # each group holds exactly the positions with that code
        np.testing.assert_array_equal(np.sort(order[bounds[c] - count[c] : bounds[c]]), np.flatnonzero(codes == c))
    # the visit of the numpy definitions (np.lexsort), up to the order of equal values
    visit = np.lexsort((values, codes))
    np.testing.assert_array_equal(cs, codes[visit])
    assert np.all(vs == values[visit])


@pytest.mark.parametrize("seed,m,n_codes,kind", GROUPED)
def test_group_order(seed, m, n_codes, kind):
    values, codes = make_grouped(seed, m, n_codes, kind)
    check_group_order(codes, values, n_codes)


def test_group_order_threshold_and_ties():
    """Group sizes around kernels._SMALL (insertion sort vs argsort), all-tie groups,
    already sorted and reversed groups, and n_codes beyond the codes used."""
    rng = np.random.default_rng(7)
    sizes = [0, 1, 2, kernels._SMALL - 1, kernels._SMALL, kernels._SMALL + 1, 3 * kernels._SMALL, 0, 5]
    codes = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    for values in (
        rng.integers(0, 3, size=len(codes)).astype(np.float64),  # many ties
        np.full(len(codes), 2.5),  # every group constant
        np.arange(len(codes), dtype=np.float64),  # already ascending
        -np.arange(len(codes), dtype=np.float64),  # descending
        rng.normal(size=len(codes)),
    ):
        perm = rng.permutation(len(codes))
        check_group_order(codes[perm], values[perm], len(sizes) + 3)
    order, count = kernels.group_order(np.zeros(0, dtype=np.int64), np.zeros(0), 4)
    assert len(order) == 0 and count.tolist() == [0, 0, 0, 0]


# ------------------------------------------------------------------------------ shifted_moments


def check_moments(xs: np.ndarray, count: np.ndarray, compare_lo_hi: bool = True) -> None:
    with np.errstate(all="ignore"):
        got = kernels.shifted_moments(xs, count)
    expected = estimators.shifted_moments(xs, count)
    names = ("dev", "m2", "scale", "lo", "hi") if compare_lo_hi else ("dev", "m2", "scale")
    for name, a, e in zip(("dev", "m2", "scale", "lo", "hi"), got, expected):
        if name in names:
            assert_bits(a, e, name)


@pytest.mark.parametrize("seed,m,n_codes,kind", GROUPED)
def test_shifted_moments(seed, m, n_codes, kind):
    """Values in the order normalize_in_groups visits them (grouped, ascending)."""
    values, codes = make_grouped(seed, m, n_codes, kind)
    order, count = kernels.group_order(codes, values, n_codes)
    check_moments(values[order], count)
    # and in file order within groups (standardize's in_order visit)
    by_code = np.argsort(codes, kind="stable")
    check_moments(values[by_code], count)


def test_shifted_moments_edges():
    count = np.array([0, 1, 3, 0, 2, 4], dtype=np.int64)
    xs = np.array([5.0, 1.0, 1.0, 1.0, 1e300, -1e300, 1e9 + 1e-3, 1e9, 1e9 + 2e-3, 1e9 + 1e-3])
    check_moments(xs, count)
    dev, m2, scale, lo, hi = kernels.shifted_moments(xs, count)
    assert m2[0] == m2[3] == lo[0] == hi[3] == 0.0 and scale[0] == scale[3] == 1.0  # empty groups
    assert m2[1] == 0.0 and m2[2] == 0.0  # singleton and constant groups
    assert scale[4] == 1e300 and m2[4] == 2.0  # the scale branch
    check_moments(np.zeros(0), np.zeros(3, dtype=np.int64))
    check_moments(np.zeros(0), np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize(
    "xs",
    [
        [1.0, 2.0, np.inf],
        [-np.inf, 1.0, 2.0],
        [-np.inf, np.inf],
        [np.inf, np.inf],
        [1.7e308, -1.7e308, 0.0],  # shifted values overflow to inf
        [1.0, np.inf, 2.0, -np.inf],
    ],
)
def test_shifted_moments_infinities(xs):
    """±inf inside a group: no exception, the same inf/NaN pattern as numpy, lo/hi included."""
    xs = np.array(xs + [3.0, 4.0])
    check_moments(xs, np.array([len(xs) - 2, 2], dtype=np.int64))


@pytest.mark.parametrize("xs", [[np.nan, 1.0, 2.0], [1.0, 2.0, np.nan], [1.0, np.nan, 1.0], [np.nan], [np.nan, np.inf]])
def test_shifted_moments_nan_dev_m2_scale(xs):
    """NaN inside a group: no exception; dev, m2 and scale have numpy's NaN pattern (the whole
    group NaN, the next group untouched)."""
    xs = np.array(xs + [3.0, 4.0])
    check_moments(xs, np.array([len(xs) - 2, 2], dtype=np.int64), compare_lo_hi=False)


@pytest.mark.parametrize("xs", [[1.0, 2.0, np.nan], [1.0, np.nan, 1.0]])
def test_shifted_moments_nan_lo_hi(xs):
    """lo/hi of a group holding NaN after its first value: numpy gives NaN."""
    xs = np.array(xs + [3.0, 4.0])
    check_moments(xs, np.array([len(xs) - 2, 2], dtype=np.int64))


# ------------------------------------------------------------------------------ normalize_in_groups


def check_normalize(values, codes, n_codes, normalize_by_std):
    got = kernels.normalize_in_groups(values, codes, n_codes, normalize_by_std, EPS)
    expected = estimators.normalize_in_groups(values, codes, n_codes, normalize_by_std)
    assert_bits(got[0], expected[0], "out")
    assert (int(got[1]), int(got[2])) == expected[1:], "singleton / constant counts"


@pytest.mark.parametrize("normalize_by_std", [True, False])
@pytest.mark.parametrize("seed,m,n_codes,kind", GROUPED)
def test_normalize_in_groups(seed, m, n_codes, kind, normalize_by_std):
    values, codes = make_grouped(seed, m, n_codes, kind)
    check_normalize(values, codes, n_codes, normalize_by_std)


@pytest.mark.parametrize("normalize_by_std", [True, False])
def test_normalize_in_groups_edges(normalize_by_std):
    """Singleton, constant, empty (n_codes beyond the codes used), precision, overflow and
    infinite groups; one group above the insertion-sort threshold."""
    groups = [
        [3.0],  # singleton
        [2.0, 2.0, 2.0],  # constant
        [1e9 + 1e-3, 1e9, 1e9 + 3e-3, 1e9 + 1e-3],  # precision
        [1e300, -1e300, 5e299],  # squares overflow
        [1.0, 2.0, np.inf],
        [-0.0, 0.0, 1.0],
        list(np.linspace(-1.0, 1.0, kernels._SMALL + 5)),
    ]
    values = np.array([v for g in groups for v in g])
    codes = np.repeat(np.arange(len(groups), dtype=np.int64) * 2, [len(g) for g in groups])  # odd codes unused
    perm = np.random.default_rng(3).permutation(len(values))
    with np.errstate(all="ignore"):
        check_normalize(values[perm], codes[perm], 2 * len(groups) + 1, normalize_by_std)
    out, n_singleton, n_constant = kernels.normalize_in_groups(
        values, codes, 2 * len(groups) + 1, normalize_by_std, EPS
    )
    assert (n_singleton, n_constant) == (1, 1)
    assert np.all(out[:4] == 0.0)
    check_normalize(np.zeros(0), np.zeros(0, dtype=np.int64), 0, normalize_by_std)
    check_normalize(np.zeros(0), np.zeros(0, dtype=np.int64), 3, normalize_by_std)


@pytest.mark.parametrize("normalize_by_std", [True, False])
def test_normalize_in_groups_nan(normalize_by_std):
    values = np.array([1.0, 1.0, np.nan, 3.0, 4.0])
    codes = np.array([0, 0, 0, 1, 1], dtype=np.int64)
    with np.errstate(all="ignore"):
        check_normalize(values, codes, 2, normalize_by_std)


# ------------------------------------------------------------------------------ standardize_in_scopes


def check_standardize(values, codes, n_codes, in_order):
    """in_order: codes come sorted (one run per scope, as a trajectory's steps do) and
    standardize_in_trajectories visits each run in place, also with the rows moved elsewhere;
    else standardize_in_scopes visits each scope by value."""
    if not in_order:
        expected = estimators.standardize_in_scopes(values, codes, n_codes)
        got = kernels.standardize_in_scopes(values, codes, n_codes, Z_STD_FLOOR)
        assert_bits(got[0], expected[0], "z")
        assert int(got[1]) == expected[1], "flat scopes"
        return
    length = np.bincount(codes, minlength=n_codes).astype(np.int64)
    start = (np.cumsum(length) - length).astype(np.int64)
    expected = estimators.standardize_in_trajectories(values, make_index(start, length))
    got = kernels.standardize_in_trajectories(values, kindex(start, length), Z_STD_FLOOR)
    assert_bits(got[0], expected[0], "z")
    assert int(got[1]) == expected[1], "flat scopes"
    rows = np.random.default_rng(len(values)).permutation(len(values)).astype(np.int64)
    moved = kernels.standardize_in_trajectories(in_file(values, rows), kindex(start, length, rows), Z_STD_FLOOR)
    assert_bits(moved[0][rows], expected[0], "z through rows")
    assert int(moved[1]) == expected[1]
    numpy_moved = estimators.standardize_in_trajectories(in_file(values, rows), make_index(start, length, rows))
    assert_bits(numpy_moved[0][rows], expected[0], "numpy z through rows")


@pytest.mark.parametrize("in_order", [False, True])
@pytest.mark.parametrize("seed,m,n_codes,kind", GROUPED)
def test_standardize_in_scopes(seed, m, n_codes, kind, in_order):
    values, codes = make_grouped(seed, m, n_codes, kind)
    rng = np.random.default_rng(seed)
    values[rng.random(m) < 0.2] = np.nan  # no action tokens: left out
    if in_order:
        codes = np.sort(codes)
    check_standardize(values, codes, n_codes, in_order)


@pytest.mark.parametrize("in_order", [False, True])
def test_standardize_in_scopes_edges(in_order):
    """All NaN; NaN-only scope; one value; constant (flat); tiny spread below the floor;
    precision; overflow; unused scope codes."""
    scopes = [
        [np.nan, np.nan],
        [4.0, np.nan],
        [1.0, 1.0, 1.0],
        [1.0, 1.0 + 1e-12, 1.0],  # std0 below the floor
        [1e9 + 1e-3, np.nan, 1e9, 1e9 + 2e-3],
        [1e300, -1e300, 3e299],
        list(np.linspace(0.0, 3.0, kernels._SMALL + 3)),
    ]
    values = np.array([v for s in scopes for v in s])
    codes = np.repeat(np.arange(len(scopes), dtype=np.int64), [len(s) for s in scopes])
    if not in_order:
        perm = np.random.default_rng(5).permutation(len(values))
        values, codes = values[perm], codes[perm]
    check_standardize(values, codes, len(scopes) + 2, in_order)
    z, n_flat = kernels.standardize_in_scopes(values, codes, len(scopes) + 2, Z_STD_FLOOR)
    assert n_flat == 3  # one value, constant, below the floor (the NaN-only scope has no values)
    assert np.all(z[np.isnan(values)] == 0.0)
    check_standardize(np.full(4, np.nan), np.zeros(4, dtype=np.int64), 1, in_order)
    check_standardize(np.zeros(0), np.zeros(0, dtype=np.int64), 2, in_order)


# ------------------------------------------------------------------------------ Hypothesis


@st.composite
def grouped_values(draw, allow_nan: bool = False, allow_infinity: bool = False):
    """(values, codes, n_codes): arbitrary float64 values (extremes included) in a few groups,
    some codes unused, ties likely."""
    n_codes = draw(st.integers(1, 6))
    element = st.one_of(
        st.floats(allow_nan=allow_nan, allow_infinity=allow_infinity, width=64),
        st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e9, 1e9 + 1e-3, 1e300, -1e300]),
    )
    pairs = draw(st.lists(st.tuples(st.integers(0, n_codes - 1), element), max_size=3 * kernels._SMALL))
    codes = np.array([c for c, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs], dtype=np.float64)
    return values, codes, n_codes


@HYPOTHESIS
@given(grouped_values(allow_infinity=True))
def test_hypothesis_moments(case):
    values, codes, n_codes = case
    order, count = kernels.group_order(codes, values, n_codes)
    check_moments(values[order], count)


@HYPOTHESIS
@given(grouped_values(allow_infinity=True), st.booleans())
def test_hypothesis_normalize(case, normalize_by_std):
    values, codes, n_codes = case
    check_normalize(values, codes, n_codes, normalize_by_std)


@HYPOTHESIS
@given(grouped_values(allow_nan=True), st.booleans())
def test_hypothesis_standardize(case, in_order):
    values, codes, n_codes = case
    if in_order:
        codes = np.sort(codes)
    check_standardize(values, codes, n_codes, in_order)


# ------------------------------------------------------------------------------ step_groups_by_hash


def random_index(rng: np.random.Generator, n_traj: int, n_groups: int, max_len: int, identity: bool):
    """A random row index: trajectory lengths, groups, a canonical order of the trajectories
    (groups contiguous) and an order (index position -> file row)."""
    traj_len = rng.integers(1, max_len + 1, size=n_traj).astype(np.int64)
    traj_start = (np.cumsum(traj_len) - traj_len).astype(np.int64)
    traj_group = np.unique(rng.integers(0, n_groups, size=n_traj), return_inverse=True)[1].astype(np.int64)
    canon = np.lexsort((rng.permutation(n_traj), rng.permutation(n_groups)[traj_group])).astype(np.int64)
    n = int(traj_len.sum())
    order = np.zeros(0, dtype=np.int64) if identity else rng.permutation(n).astype(np.int64)
    return traj_start, traj_len, traj_group, canon, order


def loop_step_groups(hashes, order, traj_start, traj_len, traj_group, canon):
    """Walk trajectories in canonical order, steps ascending; a new (group, hash) gets the next
    code. Returns (code of each row, rows per code, each code's smallest row)."""
    codes = np.empty(len(hashes), dtype=np.int64)
    seen: dict[tuple[int, int], int] = {}
    members: list[list[int]] = []
    for t in canon.tolist():
        for p in range(traj_start[t], traj_start[t] + traj_len[t]):
            row = p if len(order) == 0 else int(order[p])
            key = (int(traj_group[t]), int(hashes[row]))
            if key not in seen:
                seen[key] = len(seen)
                members.append([])
            codes[row] = seen[key]
            members[seen[key]].append(row)
    return (
        codes,
        np.array([len(m) for m in members], dtype=np.int64),
        np.array([min(m) for m in members], dtype=np.int64),
    )


def row_traj_of(order: np.ndarray, traj_start: np.ndarray, traj_len: np.ndarray) -> np.ndarray:
    """The trajectory of each file row, from the index (`order`: position -> row)."""
    traj_by_pos = np.repeat(np.arange(len(traj_len), dtype=np.int64), traj_len)
    return traj_by_pos if len(order) == 0 else in_file(traj_by_pos, order)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "n_traj,n_groups,max_len,n_hashes",
    [(1, 1, 1, 1), (5, 1, 4, 2), (40, 6, 12, 5), (300, 40, 30, 1000), (300, 300, 3, 2**62)],
)
@pytest.mark.parametrize("identity", [False, True])
def test_step_groups_by_hash(seed, n_traj, n_groups, max_len, n_hashes, identity):
    """Codes as the canonical walk numbers them, whatever order the groups are taken in; the
    pairs: every row of a multi-row code but its smallest, with that smallest row. The same as
    step_groups.hash_codes and as a plain loop."""
    rng = np.random.default_rng(seed)
    traj_start, traj_len, traj_group, canon, order = random_index(rng, n_traj, n_groups, max_len, identity)
    index = make_index(traj_start, traj_len, order, traj_group, canon)
    n = int(traj_len.sum())
    hashes = rng.integers(0, n_hashes, size=n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    codes, rows, reps = kernels.step_groups_by_hash(hashes, kernels.Index.of(index))
    e_codes, e_size, e_rep = loop_step_groups(hashes, order, traj_start, traj_len, traj_group, canon)
    np.testing.assert_array_equal(codes, e_codes, strict=True)
    expected = sorted((r, int(e_rep[c])) for r, c in enumerate(e_codes.tolist()) if e_size[c] > 1 and r != e_rep[c])
    assert sorted(zip(rows.tolist(), reps.tolist())) == expected
    n_codes, n_rows, n_reps = step_groups.hash_codes(hashes, index)
    np.testing.assert_array_equal(n_codes, codes, strict=True)
    assert sorted(zip(n_rows.tolist(), n_reps.tolist())) == expected


# ------------------------------------------------------------------------------ renumber_by_first_position


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "n_traj,n_groups,max_len,n_hashes",
    [(1, 1, 1, 1), (5, 1, 4, 2), (40, 6, 12, 5), (300, 40, 30, 1000), (200, 3, 60, 4)],
)
@pytest.mark.parametrize("identity", [False, True])
@pytest.mark.parametrize("normalize_by_std", [False, True])
def test_normalize_step_groups(seed, n_traj, n_groups, max_len, n_hashes, identity, normalize_by_std):
    """Episode group by episode group, the same values and sizes as estimators.step_advantage,
    bit for bit (groups above the insertion-sort threshold and ties included); codes that span
    more than their group's rows, or occur in two groups, are refused."""
    rng = np.random.default_rng(seed)
    traj_start, traj_len, traj_group, canon, order = random_index(rng, n_traj, n_groups, max_len, identity)
    index = make_index(traj_start, traj_len, order, traj_group, canon)
    n = int(traj_len.sum())
    hashes = rng.integers(0, n_hashes, size=n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    row_traj = row_traj_of(order, traj_start, traj_len)
    codes, _, _ = kernels.step_groups_by_hash(hashes, kernels.Index.of(index))
    k = int(codes.max()) + 1
    kindex_ = kernels.Index.of(index)

    def run(values, codes):
        return kernels.normalize_step_groups(values, codes, int(codes.max()) + 1, kindex_, normalize_by_std, EPS)

    def numpy_step_advantage(values, codes):
        rollouts = estimators.Rollouts(index, np.zeros(n), step_group=codes)
        adv, size, diag = estimators.step_advantage(rollouts, values, normalize_by_std)
        return adv, size, diag["step_singleton_groups"], diag["step_constant_groups"]

    for kind in KINDS:
        values = random_values(rng, n, kind)
        ok, out, size, single, const = run(values, codes)
        assert ok
        e_out, e_size, e_single, e_const = numpy_step_advantage(values, codes)
        assert_bits(out, e_out, kind)
        assert (single, const) == (e_single, e_const)
        np.testing.assert_array_equal(size, e_size, strict=True)
    # codes renumbered at random: accepted exactly when every group's codes still span fewer
    # values than its rows, and then still right
    shuffled = rng.permutation(k)[codes]
    group_of_row = traj_group[row_traj]
    groups = range(int(traj_group.max()) + 1)
    spans = [(np.ptp(shuffled[group_of_row == g]), int((group_of_row == g).sum())) for g in groups]
    ok, out, _, single, const = run(values, shuffled)
    assert ok == all(span < rows for span, rows in spans)
    if ok:
        e_out, _, e_single, e_const = numpy_step_advantage(values, shuffled)
        assert_bits(out, e_out, "renumbered")
        assert (single, const) == (e_single, e_const)
    # one code in two episode groups: refused
    if traj_group.max() >= 1:
        merged = codes.copy()
        first_of = [codes[group_of_row == g].min() for g in (0, 1)]
        merged[merged == first_of[1]] = first_of[0]
        assert not run(values, merged)[0]


# ------------------------------------------------------------------------------ trajectory_sums


@pytest.mark.parametrize("seed", SEEDS)
def test_trajectory_sums_match_numpy(seed):
    """Per-trajectory centred sums over the non-NaN u, in step order: the same as
    summary.centred_sums and as a plain loop per trajectory (sequential float adds), for
    (x−mx)², (u−mu)² and (x−mx)(u−mu)."""
    rng = np.random.default_rng(seed)
    length = rng.integers(1, 9, size=int(rng.integers(1, 40)))
    start = np.cumsum(length) - length
    n = int(length.sum())
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4)
    u = rng.gamma(2.0, 0.3, size=n)
    u[rng.random(n) < 0.3] = np.nan
    mx, mu = float(rng.standard_normal()), float(rng.standard_normal())
    got = kernels.trajectory_sums(x, u, kindex(start, length), mx, mu)
    rows = rng.permutation(n).astype(np.int64)
    moved = kernels.trajectory_sums(in_file(x, rows), in_file(u, rows), kindex(start, length, rows), mx, mu)
    for a, b in zip(moved, got):
        assert_bits(a, b, "through rows")
    expected = [np.zeros(len(start)) for _ in range(3)]
    for t, (a, k) in enumerate(zip(start, length)):
        for i in range(a, a + k):
            if not np.isnan(u[i]):
                dx, du = x[i] - mx, u[i] - mu
                for j, term in enumerate((dx * dx, du * du, dx * du)):
                    expected[j][t] += term
    assert len(got) == 3
    for name, a, e in zip(("sxx", "suu", "sxu"), got, expected):
        assert_bits(a, e, name)
    for name, a, e in zip(("sxx", "suu", "sxu"), summary.centred_sums(x, u, mx, mu, make_index(start, length)), got):
        assert_bits(a, e, f"numpy {name}")
    numpy_moved = summary.centred_sums(in_file(x, rows), in_file(u, rows), mx, mu, make_index(start, length, rows))
    for a, b in zip(numpy_moved, got):
        assert_bits(a, b, "numpy through rows")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("damage", ["none", "duplicate", "gap", "negative", "beyond", "group", "reward", "done"])
@pytest.mark.parametrize("optional", [False, True])
def test_trajectory_index(seed, damage, optional):
    """Rows ordered by (trajectory, step) and each trajectory's group when every rule holds
    (steps 0..T−1 without duplicates, one group, constant episode_reward, done only on the
    last step); any broken rule makes the index invalid (the numpy checks then name the rows).
    Without the optional columns their rules are not checked."""
    rng = np.random.default_rng(seed)
    length = rng.integers(1, 9, size=int(rng.integers(1, 30)))
    n_traj = len(length)
    traj = np.repeat(np.arange(n_traj, dtype=np.int64), length)
    step = np.concatenate([np.arange(k, dtype=np.int64) for k in length])
    traj_group = rng.integers(0, 4, size=n_traj).astype(np.int64)
    group = traj_group[traj]
    reward = rng.standard_normal(n_traj)[traj]
    done = step == length[traj] - 1
    done &= rng.random(len(done)) < 0.7  # unfinished trajectories too
    perm = rng.permutation(len(traj))
    traj, step, group, reward, done = traj[perm], step[perm], group[perm], reward[perm], done[perm]
    long = np.flatnonzero(length[traj] > 1)
    damaged = damage != "none" and len(long) > 0
    if damaged:
        i = int(rng.choice(long))
        k = length[traj[i]]
        if damage in ("duplicate", "gap", "negative", "beyond"):
            step[i] = {"duplicate": (step[i] + 1) % k, "gap": k + 3, "negative": -1, "beyond": k}[damage]
        elif damage == "group":
            group[i] += 1
        elif damage == "reward":
            reward[i] += 1e-9
        else:
            done[i] = step[i] != k - 1  # true before the last step (or the last step unmarked)
            done[np.flatnonzero((traj == traj[i]) & (step == k - 1))] = False
            done[i] = step[i] != k - 1
            damaged = bool(done[i])
    if not optional:
        args = (np.zeros(0, dtype=bool), np.zeros(0))
        damaged &= damage not in ("reward", "done")
    else:
        args = (done, reward)
    valid, order, start, count, got_group = kernels.trajectory_index(traj, step, group, *args, n_traj)
    np.testing.assert_array_equal(count, np.bincount(traj, minlength=n_traj), strict=True)
    np.testing.assert_array_equal(start, np.cumsum(count) - count, strict=True)
    assert valid == (not damaged)
    if valid:
        np.testing.assert_array_equal(order, np.lexsort((step, traj)), strict=True)
        np.testing.assert_array_equal(got_group, traj_group, strict=True)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_lam", [False, True])
def test_trajectory_summary(seed, with_lam):
    """The summary's fused pass gives the sums of summary.trajectory_sums, bit for bit, and of
    plain loops, through `rows` as in place."""
    rng = np.random.default_rng(seed)
    length = rng.integers(1, 30, size=int(rng.integers(1, 40)))
    start = np.cumsum(length) - length
    n = int(length.sum())
    adv_e, adv_s = rng.standard_normal(n), rng.standard_normal(n) * 10.0
    lam, u = rng.random(n), rng.gamma(2.0, 0.3, size=n)
    u[rng.random(n) < 0.3] = np.nan
    w = float(rng.choice([0.0, 1.0, 2.5]))
    none = np.zeros(0)
    args = (lam, u) if with_lam else (none, none)
    got = kernels.trajectory_summary(adv_e, adv_s, w, *args, kindex(start, length))
    sums = [np.zeros(len(start)) for _ in range(6)]  # plain loops: each sum in step order
    for t, (a, k) in enumerate(zip(start, length)):
        for i in range(a, a + k):
            terms = [abs(adv_e[i]), abs(w * adv_s[i])]
            if with_lam:
                terms.append(lam[i])
                if not np.isnan(u[i]):
                    terms += [lam[i], u[i], 1.0]
            for j, term in enumerate(terms):
                sums[j][t] += term
    for name, a, e in zip(("|A^E|", "|w A^S|", "lambda", "lambda kept", "u kept", "kept"), got, sums):
        assert_bits(a, e, name)
    lam_u = (lam, u) if with_lam else (None, None)
    for a, b in zip(summary.trajectory_sums(adv_e, adv_s, w, *lam_u, make_index(start, length)), got):
        assert_bits(a, b, "numpy")
    rows = rng.permutation(n).astype(np.int64)
    moved_args = tuple(in_file(a, rows) for a in args) if with_lam else args
    moved = kernels.trajectory_summary(
        in_file(adv_e, rows), in_file(adv_s, rows), w, *moved_args, kindex(start, length, rows)
    )
    for a, b in zip(moved, got):
        assert_bits(a, b, "through rows")
    moved_lam_u = tuple(in_file(a, rows) for a in args) if with_lam else (None, None)
    numpy_moved = summary.trajectory_sums(
        in_file(adv_e, rows), in_file(adv_s, rows), w, *moved_lam_u, make_index(start, length, rows)
    )
    for a, b in zip(numpy_moved, got):
        assert_bits(a, b, "numpy through rows")


@pytest.mark.parametrize("seed", SEEDS)
def test_trajectory_totals(seed):
    """Σ x per trajectory, added in step order as a plain loop does, whatever the rows' order
    in the file: the same as estimators.trajectory_totals."""
    rng = np.random.default_rng(seed)
    length = rng.integers(1, 30, size=int(rng.integers(1, 40)))
    start = np.cumsum(length) - length
    n = int(length.sum())
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 9, size=n)
    got = kernels.trajectory_totals(x, kindex(start, length))
    expected = np.zeros(len(start))
    for t, (a, k) in enumerate(zip(start, length)):
        acc = 0.0
        for i in range(a, a + k):
            acc += x[i]
        expected[t] = acc
    assert_bits(got, expected, "totals")
    assert_bits(estimators.trajectory_totals(x, make_index(start, length)), expected, "numpy")
    rows = rng.permutation(n).astype(np.int64)
    assert_bits(kernels.trajectory_totals(in_file(x, rows), kindex(start, length, rows)), expected, "rows")
    assert_bits(estimators.trajectory_totals(in_file(x, rows), make_index(start, length, rows)), expected, "numpy rows")


def test_warm_up_runs_every_kernel():
    """kernels.warm_up (run in a background thread by `gaca advantages` while it reads the
    log) calls every kernel once without error."""
    kernels.warm_up()


def test_warm_up_covers_the_signatures_a_run_uses():
    """After kernels.warm_up, runs of every method and scope on the example log (read as the
    command reads it, the compiled path forced) call every kernel, and none with argument
    types the warm-up did not load: otherwise that kernel's machine code would be loaded (or
    compiled) in the middle of the compute phase. In a fresh interpreter, so that other tests'
    calls cannot have loaded them already."""
    import os
    import subprocess
    import sys

    code = f"""
import functools, numba
from gaca_cli.credit import _kernels as K
from gaca_cli.log import _kernels as LK
from gaca_cli.credit.run import compute_advantages
from gaca_cli.credit.reading import read_for_advantages
from gaca_cli.credit.config import AdvantagesConfig
K.warm_up()
kernels = {{(m, n): d for m in (K, LK) for n, d in vars(m).items() if isinstance(d, numba.core.registry.CPUDispatcher)}}
before = {{k: set(d.signatures) for k, d in kernels.items()}}
called = set()
def counting(name, d):
    @functools.wraps(d)
    def call(*args):
        called.add(name)
        return d(*args)
    return call
for (m, n), d in kernels.items():
    setattr(m, n, counting(n, d))
for method in ("grpo", "gigpo", "gaca"):
    for scope in ("trajectory", "group", "batch"):
        config = AdvantagesConfig(method=method, nll_scope=scope)
        compute_advantages(read_for_advantages([{str(EXAMPLE_LOG)!r}], {{}}, config), config)
print(sorted(n for (m, n), d in kernels.items() if set(d.signatures) - before[(m, n)]))
print(sorted(called))
"""
    env = {**os.environ, ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    new_signatures, called = done.stdout.strip().splitlines()
    assert new_signatures == "[]", new_signatures
    # every kernel the library calls (the others are called by these)
    entry_points = [
        "discounted_returns",
        "normalize_in_groups",
        "normalize_step_groups",
        "standardize_in_scopes",
        "standardize_in_trajectories",
        "step_groups_by_hash",
        "trajectory_index",
        "trajectory_summary",
        "trajectory_sums",
        "trajectory_totals",  # R(τ) = Σ r_t: the example log has no episode_reward
    ]
    assert called == str(sorted(entry_points))
