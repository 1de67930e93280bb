"""Nothing a source record holds is lost by `gaca import`, for every format and fixture.

Each source record (a JSON line, a JSON document, a Parquet row) is flattened to its leaf
values (a string that holds JSON, as verifiers' tool calls and ART's metrics are saved, is
read as JSON first); every leaf must appear in the imported log: as a value of a column, a
value in `extra`, an element of a list column (token ids, log-probs), or inside a text column
built from it (an action with its tool calls, messages, a final_observation). Booleans, nulls
and empty strings are left out (they cannot be told apart from any other), and so is the role
"assistant": a turn of the policy is the row's `action`, and the type of an OpenAI text part
(`{"type": "text", "text": ...}`): such parts are their text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gaca_cli.integrations.imports.base import ImportOptions
from gaca_cli.integrations.imports.core import run_import

DATA = Path(__file__).parents[1] / "data"
VERIFIERS = DATA / "verifiers"
REAL_VERIFIERS = Path(__file__).parents[3] / "shared" / "data" / "verifiers" / "real"

#: (format, the files of one import); summaries the importers pass over are not records
FIXTURES = [
    ("chat-jsonl", [DATA / "chat-jsonl" / "chats.jsonl"]),
    ("chat-jsonl", [DATA / "chat-jsonl" / "steps.jsonl"]),
    (
        "art",
        [
            DATA / "art" / "trajectories" / "train" / "0000.parquet",
            DATA / "art" / "trajectories" / "val" / "0001.parquet",
        ],
    ),
    ("art", [DATA / "art" / "legacy" / "trajectories" / "train" / "0000.jsonl"]),
    ("rllm", sorted((DATA / "rllm" / "episodes" / "train_step_3_epoch_0").glob("episode_*.json"))),
    ("rllm", sorted((DATA / "rllm" / "to_dict").glob("*.json"))),
    *[("rllm", [p]) for p in sorted((DATA / "rllm" / "versions").glob("*/results.json"))],
    *[("rllm", sorted(d.glob("episode_*.json"))) for d in sorted((DATA / "rllm" / "versions").glob("*/episodes/*"))],
    ("skyrl", [DATA / "skyrl" / "dumped_evals" / "global_step_3_evals" / "house_garden.jsonl"]),
    ("skyrl", [DATA / "skyrl" / "dumped_evals" / "global_step_3_evals" / "unknown.jsonl"]),
    ("skyrl", [DATA / "skyrl" / "generator_batch.jsonl"]),
    ("skyrl", [DATA / "skyrl" / "generator_stepwise.jsonl"]),
    ("swift", [DATA / "swift" / "grpo" / "completions.jsonl"]),
    ("swift", [DATA / "swift" / "ray_driver" / "completions.jsonl"]),
    ("trl", sorted((DATA / "trl" / "standard").glob("*.parquet"))),
    ("trl", sorted((DATA / "trl" / "conversational").glob("*.parquet"))),
    ("trl", sorted((DATA / "trl" / "0.29" / "standard").glob("*.parquet"))),
    ("trl", sorted((DATA / "trl" / "0.29" / "conversational").glob("*.parquet"))),
    ("verl", sorted((DATA / "verl" / "rollout").glob("*.jsonl"))),
    ("verl", [DATA / "verl" / "validation" / "3.jsonl"]),
    ("verl", [DATA / "verl" / "v1_rollout" / "4.jsonl"]),
    ("verl", [DATA / "verl" / "agent_loop" / "trajectories.jsonl"]),
    ("verifiers", [VERIFIERS / "evals" / "math-tools--tiny-model" / "run0" / "results.jsonl"]),
    ("verifiers", sorted((VERIFIERS / "v04").glob("*/traces.jsonl"))),
    *[("verifiers", [p]) for p in sorted((VERIFIERS / "versions").glob("*/results.jsonl"))],
    # real vf-eval runs, where the shared folder beside the checkout holds them (not in this repository)
    *[("verifiers", [p]) for p in sorted(REAL_VERIFIERS.glob("*/*/results.jsonl"))],
    *[("verl", [p]) for p in sorted((DATA / "verl" / "versions").glob("*/*.jsonl"))],
    *[
        ("skyrl", [p])
        for p in sorted((DATA / "skyrl" / "versions").rglob("*.jsonl"))
        if p.name != "aggregated_results.jsonl"
    ],
    # the releases that wrote YAML are held in test_import_art.py (converted as the error says)
    *[("art", [p]) for p in sorted((DATA / "art" / "versions").glob("*/trajectories/*/*.jsonl"))],
    *[("swift", [p]) for p in sorted((DATA / "swift" / "versions").glob("*/completions.jsonl"))],
]


def records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) for each source record of a file."""
    if path.suffix == ".parquet":
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path.name} row {i}", row
    elif path.suffix == ".json":
        yield path.name, json.loads(path.read_text())
    else:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                yield f"{path.name} line {n}", json.loads(line)


def leaves(value: Any) -> Iterator[Any]:
    """The leaf values of a JSON value (strings holding a JSON object or list read as JSON)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if isinstance(value, dict) and value.get("type") == "text" and set(value) == {"type", "text"}:
        yield from leaves(value["text"])
    elif isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from leaves(item)
    elif value is not None and not isinstance(value, bool) and value not in ("", "assistant"):
        yield value


def _numeric(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


class Output:
    """Every leaf value of an imported log, for lookups."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        values = [leaf for row in rows for leaf in leaves(row)]
        self.texts = [v for v in values if isinstance(v, str)]
        self.joined = "\n".join(self.texts)
        self.numbers = {round(n, 3) for v in values if (n := _numeric(v)) is not None and math.isfinite(n)}

    def holds(self, leaf: Any) -> bool:
        n = _numeric(leaf)
        if n is not None:
            return not math.isfinite(n) or round(n, 3) in self.numbers or str(leaf) in self.joined
        # a tool call's arguments are JSON text inside the JSON of the action: escaped twice
        return any(
            text in self.joined for text in (str(leaf), json.dumps(leaf)[1:-1], json.dumps(json.dumps(leaf))[3:-3])
        )


@pytest.mark.parametrize(("fmt", "files"), FIXTURES, ids=[f"{f}:{p[0].parent.name}/{p[0].name}" for f, p in FIXTURES])
def test_every_leaf_of_every_source_record_is_in_the_log(tmp_path, fmt, files):
    assert files and all(f.exists() for f in files)
    out = tmp_path / "log.parquet"
    weights = (1.0, 0.5) if files[0].parent.name == "standard" else None  # the trl run's reward_weights
    result = run_import(fmt, files, out, ImportOptions(reward_weights=weights))
    assert not result.violations, result.violations
    output = Output(pq.read_table(out).to_pylist())
    lost = [
        f"{where}: {leaf!r:.80}"
        for path in files
        for where, record in records(path)
        for leaf in leaves(record)
        if not output.holds(leaf)
    ]
    assert not lost, "\n".join(lost[:20])
