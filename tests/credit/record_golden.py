"""Re-record the golden files of tests/credit/test_golden.py from the current code.

    python -m tests.credit.record_golden

Writes tests/credit/golden/<case>.json: the tiny log, the parameters, and every column
`gaca advantages` adds, as the code computes them now. Re-record only after checking the
new numbers against the hand arithmetic in tests/credit/test_golden.py (that test compares the code
with both the files and the hand-computed values).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from gaca_cli.log.columns import ADVANTAGES_OUTPUTS

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"

# The tiny log (γ = 0.5 keeps the returns-to-go in halves). One row per step:
# (group_id, traj_id, step_idx, reward, anchor_obs, nll_mean)
TINY_LOG = [
    ("A", "a1", 0, 0.0, "start", 1.0),
    ("A", "a1", 1, 1.0, "door", 3.0),
    ("A", "a2", 0, 0.0, "start", 2.0),
    ("A", "a2", 1, 0.0, "key", None),
    ("A", "a2", 2, 2.0, "door", 4.0),
    ("A", "a3", 0, 0.0, "start", 1.5),
    ("A", "a3", 1, 0.0, "door", 1.5),
    ("B", "b1", 0, 0.0, "x", 0.5),
    ("B", "b1", 1, 3.0, "y", 2.5),
    ("B", "b2", 0, 1.0, "x", 3.0),
    ("C", "c1", 0, 5.0, "x", 1.0),
]
FIELDS = ("group_id", "traj_id", "step_idx", "reward", "anchor_obs", "nll_mean")

# case name -> parameters of `gaca advantages`
CASES = {
    "grpo": {"method": "grpo", "gamma": 0.5},
    "gigpo": {"method": "gigpo", "gamma": 0.5},
    "gigpo_std": {"method": "gigpo", "gamma": 0.5, "norm": "std", "step_weight": 0.5},
    "gaca": {"method": "gaca", "gamma": 0.5, "beta": 0.25},
    "hgpo": {"method": "hgpo", "gamma": 0.5},
    "hgpo_mean_base": {
        "method": "hgpo",
        "gamma": 0.5,
        "norm": "mean",
        "base_group": True,
        "history_length": 1,
        "length_weight_alpha": 2.0,
    },
}

OUTPUT_COLUMNS = ADVANTAGES_OUTPUTS  # every column gaca advantages may write


def tiny_table():
    import pyarrow as pa

    columns = list(zip(*TINY_LOG))
    types = [pa.string(), pa.string(), pa.int64(), pa.float64(), pa.large_string(), pa.float64()]
    return pa.table({name: pa.array(list(values), type=t) for name, values, t in zip(FIELDS, columns, types)})


def compute(params: dict, directory: Path) -> dict[str, list]:
    """The code's output columns for the tiny log, read from a Parquet file like a user's."""
    import pyarrow.parquet as pq

    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.run import compute_advantages
    from gaca_cli.log.reading import read_log

    path = directory / "tiny.parquet"
    pq.write_table(tiny_table(), path)
    run = compute_advantages(read_log([str(path)]), AdvantagesConfig(**params))
    return {name: run.table.column(name).to_pylist() for name in OUTPUT_COLUMNS if name in run.table.column_names}


def main() -> None:
    GOLDEN_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, params in CASES.items():
            record = {
                "params": params,
                "log": [dict(zip(FIELDS, row)) for row in TINY_LOG],
                "columns": compute(params, Path(tmp)),
            }
            path = GOLDEN_DIR / f"{name}.json"
            path.write_text(json.dumps(record, indent=1) + "\n")
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
