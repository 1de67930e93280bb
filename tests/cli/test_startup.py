"""Start-up: `gaca --help` and every `gaca COMMAND --help` build all the options from the config
dataclasses without loading numpy, rich or any data library (checked in a fresh interpreter, as a
user's shell starts it). Their cost is paid only by commands that use them.

(typer itself loads pydantic as soon as it parses a command's options, --help included: it
coerces parameter values with pydantic; that cost is typer's, the same for every command.)
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("numpy", "pyarrow", "polars", "pandas", "numba", "torch", "transformers", "rich", "pydantic")
TYPER_OWN = {"pydantic"}

_PROBE = r"""
import json, sys
from gaca_cli.cli import app
argv = json.loads(sys.argv[1])
try:
    app(args=argv, prog_name="gaca")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))}))
"""


def run_probe(*argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(argv)), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_loads_no_heavy_library():
    result = run_probe("--help")
    assert result == {"code": 0, "loaded": []}


def test_each_command_help_loads_no_heavy_library():
    for command in ("validate", "advantages", "score", "train-offline", "inspect", "demo"):
        result = run_probe(command, "--help")
        assert result["code"] == 0 and set(result["loaded"]) <= TYPER_OWN, (command, result)


def test_a_usage_error_is_found_before_any_data_library_loads():
    """A bad option value is refused from the config alone: no numpy, pyarrow or torch yet."""
    result = run_probe("train-offline", "missing.parquet", "--model", "m", "-o", "out", "--lr", "-1")
    assert result["code"] == 2
    assert not set(result["loaded"]) & {"numpy", "pyarrow", "polars", "torch"}


def test_inspect_loads_only_the_libraries_it_draws_with(tmp_path):
    """`gaca inspect` reads with pyarrow and draws with rich: polars (used by `--compare` and
    `--plot` to recompute step groups), numba and torch stay unloaded."""
    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.run import compute_advantages
    from gaca_cli.log.reading import read_log
    from gaca_cli.log.writing import write_parquet_atomic
    from tests.conftest import EXAMPLE_LOG

    run = compute_advantages(read_log([EXAMPLE_LOG]), AdvantagesConfig(method="gaca"))
    annotated = tmp_path / "example.gaca.parquet"
    write_parquet_atomic(run.table, annotated, run.metadata)
    for view in ([], ["--traj", "task-00/r0"], ["--top", "5", "--by", "weight"]):
        result = run_probe("inspect", str(annotated), "--no-pager", *view)
        assert result["code"] == 0 and {"pyarrow", "rich"} <= set(result["loaded"]), (view, result)
        assert not set(result["loaded"]) & {"polars", "numba", "torch", "transformers"}, (view, result)


_WARM_UP_PROBE = r"""
import importlib.abc, sys, threading
found = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        found.setdefault(name, threading.current_thread().name)
sys.meta_path.insert(0, Watch())
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.reading import read_for_advantages
assert not {"pandas", "polars"} & set(sys.modules)
log = read_for_advantages([sys.argv[1]], {}, AdvantagesConfig(method="grpo"))
[t.join() for t in threading.enumerate() if t.name == "gaca-kernels"]
print(found.get("pandas"), found.get("polars"))
"""


def test_advantages_imports_pandas_and_polars_while_it_reads(tmp_path):
    """pyarrow imports pandas (where installed) at its first conversion to numpy, and polars
    hashes the anchors: `gaca advantages` has both imported by its background thread while the
    log is read, instead of in the compute phase; polars only for a log with anchors."""
    import pyarrow.parquet as pq
    import pytest

    pytest.importorskip("pandas")
    from tests.conftest import EXAMPLE_LOG

    no_anchors = tmp_path / "no_anchors.parquet"
    table = pq.read_table(EXAMPLE_LOG)
    pq.write_table(table.drop_columns([n for n in ("anchor_obs", "anchor_key") if n in table.column_names]), no_anchors)
    for log, expected in ((EXAMPLE_LOG, ["gaca-kernels", "gaca-kernels"]), (no_anchors, ["gaca-kernels", "None"])):
        proc = subprocess.run(
            [sys.executable, "-c", _WARM_UP_PROBE, str(log)], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == expected, (log, proc.stdout)
