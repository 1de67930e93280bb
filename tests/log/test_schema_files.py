"""`schemas/*.json` describe exactly what the code enforces and writes.

1. The files are the current export of `gaca_cli.log.schema` (re-record them with
   `python -m gaca_cli.log.schema`).
2. What the JSON says is what the checks do: for every input column, the Arrow types its
   `accepted_types` names are accepted and every other type is refused (asked both of the
   schema object and of the real checks); `required`, `nullable` and `needs` match what the
   checks report; the warning names match what `gaca validate --json` prints.
3. The columns `outputs.schema.json` lists for each method, with their Arrow types, are the
   columns `gaca advantages` adds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.run import compute_advantages
from gaca_cli.log import columns as C
from gaca_cli.log.checks import check_log
from gaca_cli.log.reading import Log, read_log
from gaca_cli.log.schema import INPUT_BY_NAME, schema_documents, write_schema_documents

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
N = 6


def load(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- 1. export


def test_schema_files_equal_the_code():
    docs = schema_documents()
    assert sorted(p.name for p in SCHEMAS.glob("*.json")) == sorted(docs)
    for name, doc in docs.items():
        assert load(name) == doc, f"schemas/{name} is stale: run `python -m gaca_cli.log.schema`"


def test_schema_files_are_byte_identical_to_a_fresh_export(tmp_path):
    for path in write_schema_documents(tmp_path):
        assert (SCHEMAS / path.name).read_bytes() == path.read_bytes(), path.name


# --------------------------------------------------------------------------- 2. input types


def _values(n: int) -> list[int]:
    return [i % 3 for i in range(n)]


#: type families: sample Arrow arrays of each
SAMPLES: dict[str, list[pa.Array]] = {
    "string": [
        pa.array([str(v) for v in _values(N)], pa.string()),
        pa.array([str(v) for v in _values(N)], pa.large_string()),
        pa.array([str(v) for v in _values(N)], pa.string()).dictionary_encode(),
        pa.array([str(v) for v in _values(N)], pa.string_view()),
    ],
    "integer": [pa.array(_values(N), t) for t in (pa.int8(), pa.int32(), pa.int64(), pa.uint32())],
    "float": [pa.array([float(v) for v in _values(N)], t) for t in (pa.float32(), pa.float64())],
    "bool": [pa.array([False] * N, pa.bool_())],
    "int list": [
        pa.array([[1, 2]] * N, pa.list_(pa.int32())),
        pa.array([[1, 2]] * N, pa.large_list(pa.int64())),
        pa.array([[1, 2]] * N, pa.list_view(pa.int32())),
        pa.array([[1, 2]] * N, pa.large_list_view(pa.int64())),
        pa.array([[1, 2]] * N, pa.list_(pa.int32(), 2)),
    ],
    "float list": [
        pa.array([[-0.5]] * N, pa.list_(pa.float32())),
        pa.array([[-0.5]] * N, pa.list_(pa.float64())),
        pa.array([[-0.5]] * N, pa.large_list_view(pa.float32())),
        pa.array([[-0.5]] * N, pa.list_(pa.float32(), 1)),
    ],
    "chat": [
        pa.array(
            [[{"role": "user", "content": "hi"}]] * N,
            pa.list_(pa.struct([("role", pa.string()), ("content", pa.large_string())])),
        )
    ],
    "other": [
        pa.array([b"x"] * N, pa.binary()),
        pa.array(np.arange(N).astype("datetime64[s]")),
        pa.array([{"a": 1}] * N),
        pa.array([["a"]] * N, pa.list_(pa.string())),
    ],
}


def families_named(accepted_types: str) -> set[str]:
    """Which type families a human description in the JSON names, e.g.
    "float64 (any float or integer accepted)" -> {float, integer}."""
    text = accepted_types.lower()
    if text.startswith("list<struct"):
        return {"chat"}
    if text.startswith("list<"):
        element = text[len("list<") :].split(">")[0]
        return {"int list"} if element.startswith("int") else {"float list"}
    named = set()
    if "string" in text:
        named.add("string")
    if "integer" in text or text.startswith("int"):
        named.add("integer")
    if "float" in text:
        named.add("float")
    if "bool" in text:
        named.add("bool")
    assert named, f"cannot read accepted types {accepted_types!r}"
    return named


def base_table() -> pa.Table:
    """A valid log: 3 trajectories of 2 steps in one group."""
    return pa.table(
        {
            C.GROUP_ID: ["g"] * N,
            C.TRAJ_ID: ["a", "a", "b", "b", "c", "c"],
            C.STEP_IDX: pa.array([0, 1] * 3, pa.int64()),
            C.REWARD: [0.0, 1.0] * 3,
        }
    )


def as_log(table: pa.Table) -> Log:
    return Log(table=table, files=("mem.parquet",), file_row_ends=np.array([table.num_rows]))


def with_column(name: str, arr: pa.Array) -> pa.Table:
    table = base_table()
    if name in table.column_names:
        return table.set_column(table.schema.get_field_index(name), name, arr)
    return table.append_column(name, arr)


def type_refused(name: str, arr: pa.Array) -> bool:
    result = check_log(as_log(with_column(name, arr)))
    return any(v.column == name and "not usable" in v.rule for v in result.violations)


LOG_COLUMNS = [c["name"] for c in schema_documents()["log.schema.json"]["columns"]]


def test_json_lists_every_input_column():
    assert LOG_COLUMNS == list(INPUT_BY_NAME)
    assert set(C.REQUIRED) <= set(LOG_COLUMNS)


def _accepted(name: str) -> tuple[set[str], str]:
    column = next(c for c in load("log.schema.json")["columns"] if c["name"] == name)
    return families_named(column["accepted_types"]), column["accepted_types"]


@pytest.mark.parametrize("name", LOG_COLUMNS)
def test_accepted_types_match_the_schema_code(name):
    """The JSON's accepted types are exactly the types `InputColumn.accepts` takes."""
    accepted, text = _accepted(name)
    for family, arrays in SAMPLES.items():
        for arr in arrays:
            assert INPUT_BY_NAME[name].accepts(arr.type) == (family in accepted), (name, arr.type, text)


@pytest.mark.parametrize("name", LOG_COLUMNS)
def test_accepted_types_match_the_checks(name):
    """The real checks refuse a column of any type the JSON does not name (with a violation,
    never a crash), and accept the ones it names."""
    accepted, text = _accepted(name)
    for family, arrays in SAMPLES.items():
        for arr in arrays:
            assert type_refused(name, arr) == (family not in accepted), (name, arr.type, text)


# --------------------------------------------------------------------------- 2. required / nullable / needs


@pytest.mark.parametrize("name", LOG_COLUMNS)
def test_required_and_nullable_match_the_checks(name):
    column = next(c for c in load("log.schema.json")["columns"] if c["name"] == name)
    accepted = families_named(column["accepted_types"])
    family = sorted(accepted)[0]
    sample = SAMPLES[family][0]

    # required: a log without the column is refused exactly when the JSON says so
    table = base_table()
    if name in table.column_names:
        table = table.drop_columns([name])
    missing = check_log(as_log(table))
    refused = any(v.column == name and "missing" in v.rule for v in missing.violations)
    assert refused == column["required"]
    assert column["required"] == (name in C.REQUIRED)

    # nullable: one null in the column is refused exactly when the JSON says it is not nullable
    if name in base_table().column_names:
        sample = base_table()[name].combine_chunks()
    values = sample.to_pylist()
    values[1] = None
    result = check_log(as_log(with_column(name, pa.array(values, sample.type))))
    null_refused = any(v.column == name and "null" in v.rule for v in result.violations)
    assert null_refused == (not column["nullable"]), (name, [str(v) for v in result.violations])


def _full_table() -> pa.Table:
    """base_table plus one valid instance of every optional column."""
    table = base_table()
    extras = {
        C.PROMPT: pa.array(["p"] * N, pa.large_string()),
        C.MESSAGES: SAMPLES["chat"][0],
        C.ACTION: pa.array(["a"] * N, pa.large_string()),
        C.ANCHOR_OBS: pa.array(["s0", "s1"] * 3, pa.large_string()),
        C.ANCHOR_KEY: pa.array(["k0", "k1"] * 3),
        C.DONE: pa.array([False, True] * 3),
        C.EPISODE_REWARD: pa.array([1.0] * N),
        C.PROMPT_TOKEN_IDS: pa.array([[1, 2]] * N, pa.list_(pa.int32())),
        C.ACTION_TOKEN_IDS: pa.array([[3]] * N, pa.list_(pa.int32())),
        C.BEHAVIOR_LOGPROBS: pa.array([[-0.5]] * N, pa.list_(pa.float32())),
        C.NLL_SUM: pa.array([0.5] * N),
        C.NLL_MEAN: pa.array([0.5] * N),
        C.ADVANTAGE: pa.array([0.0] * N),
    }
    for name, arr in extras.items():
        table = table.append_column(name, arr)
    return table


NEEDS = schema_documents()["log.schema.json"]["needs"]


def test_full_table_is_valid_for_every_command():
    for command in NEEDS:
        result = check_log(as_log(_full_table()), command)
        assert not result.violations, (command, [str(v) for v in result.violations])


@pytest.mark.parametrize("command", sorted(NEEDS))
def test_needs_match_the_checks(command):
    """Dropping every alternative of one need breaks the command; keeping any one is enough."""
    full = _full_table()
    for alternatives in NEEDS[command]:
        result = check_log(as_log(full.drop_columns(alternatives)), command)
        assert any("needs" in v.rule for v in result.violations), (command, alternatives)
        for keep in alternatives:
            dropped = [a for a in alternatives if a != keep]
            result = check_log(as_log(full.drop_columns(dropped)), command)
            assert not result.violations, (command, keep, [str(v) for v in result.violations])
    # nothing beyond the listed needs (and the required columns) is needed
    listed = {a for alts in NEEDS[command] for a in alts}
    bare = full.drop_columns([n for n in full.column_names if n not in C.REQUIRED])
    result = check_log(as_log(bare.append_column("x", pa.array([0] * N))), command)
    assert len(result.violations) == len(NEEDS[command]), (command, listed, [str(v) for v in result.violations])


def test_needs_entries_are_known_columns_and_commands():
    known = set(INPUT_BY_NAME) | set(C.ADVANTAGES_OUTPUTS) | set(C.SCORE_OUTPUTS)
    for command, needs in NEEDS.items():
        for alternatives in needs:
            assert set(alternatives) <= known, (command, alternatives)
    for column in load("log.schema.json")["columns"]:
        for user in column["needed_by"]:
            assert user == "all" or user in NEEDS or user.split(":")[0] in {c.split(":")[0] for c in NEEDS}, user


def test_warning_names_match_validate(tmp_path):
    names = {w.split(":")[0] for w in load("log.schema.json")["warnings"]}
    path = tmp_path / "log.parquet"
    pq.write_table(_full_table(), path)
    result = check_log(read_log([path]))
    assert set(result.warnings) == names


# --------------------------------------------------------------------------- 3. outputs


@pytest.fixture(scope="module")
def example(example_log) -> Log:
    return read_log([example_log])


@pytest.mark.parametrize("method", ["grpo", "gigpo", "gaca"])
def test_advantages_outputs_match_the_json(example, method):
    doc = load("outputs.schema.json")
    listed = [o for o in doc["commands"]["advantages"] if method in o["methods"]]
    run = compute_advantages(example, AdvantagesConfig(method=method))
    added = [f for f in run.table.schema if f.name not in example.table.column_names]
    assert [f.name for f in added] == [o["name"] for o in listed]
    for field, spec in zip(added, listed):
        assert str(field.type) == spec["arrow_type"], (field.name, field.type, spec["arrow_type"])
    assert doc["metadata_keys"]["advantages"] in run.metadata
    assert set(o["name"] for o in doc["commands"]["advantages"]) == set(C.ADVANTAGES_OUTPUTS)


def test_score_outputs_are_the_score_columns():
    doc = load("outputs.schema.json")
    assert [o["name"] for o in doc["commands"]["score"]] == list(C.SCORE_OUTPUTS)
    assert doc["metadata_keys"]["score"] == C.META_SCORE
