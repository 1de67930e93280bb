"""`--from swift`: the rows read from the completions.jsonl files real ms-swift GRPO runs wrote
(tests/data/swift/: 4.6.0, and 3.12.6, 3.7.3, 3.5.3, 3.4.1, 3.2.2, 3.1.1.post1 under versions/),
checked value by value against the file read here with json, and the command end to end."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.errors import GacaError
from gaca_cli.integrations.imports import swift
from gaca_cli.integrations.imports.base import ImportOptions

DATA = Path(__file__).resolve().parents[1] / "data" / "swift"
GRPO = DATA / "grpo" / "completions.jsonl"
RAY = DATA / "ray_driver" / "completions.jsonl"
WEIGHTS = (1.0, 0.5)  # the run's reward_weights (grpo/args.json)
runner = CliRunner()


def read(*files: Path, weights: tuple[float, ...] | None = None) -> list[dict]:
    return list(swift.read(list(files), ImportOptions(reward_weights=weights)))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_fixture_has_what_the_tests_rely_on():
    table = lines(GRPO)
    assert [list(t) for t in table] == [
        ["step", "prompt", "completion", "HasE", "Brevity", "advantages", "entropy", "solution"]
    ] * 3
    assert table[1] == table[2]  # the end of training logs the last table again
    assert json.loads((DATA / "grpo" / "args.json").read_text())["reward_weights"] == list(WEIGHTS)


def test_every_value_of_the_grpo_table():
    table = lines(GRPO)[:2]  # the third line repeats the second
    rows = read(GRPO)
    assert len(rows) == sum(len(t["prompt"]) for t in table)
    it = iter(rows)
    for number, t in enumerate(table, start=1):
        for i in range(len(t["prompt"])):
            row = next(it)
            reward = WEIGHTS[0] * t["HasE"][i] + WEIGHTS[1] * t["Brevity"][i]
            assert row["traj_id"] == f"{GRPO}:{number}:{i}"
            assert row["step_idx"] == 0 and row["done"] is True
            assert row["prompt"] == t["prompt"][i]
            assert row["action"] == t["completion"][i]
            assert row["reward"] == pytest.approx(reward, abs=1e-15)
            assert row["episode_reward"] == row["reward"]
            assert row["reward_HasE"] == t["HasE"][i]
            assert row["reward_Brevity"] == t["Brevity"][i]
            assert row["source_advantage"] == t["advantages"][i]
            assert row["training_step"] == int(t["step"][i])
            assert row["entropy"] == t["entropy"][i]
            assert row["solution"] == t["solution"][i]
            assert "extra" not in row


def test_groups_are_one_prompt_at_one_logging_step():
    rows = read(GRPO)
    by_group: dict[str, set] = {}
    for row in rows:
        by_group.setdefault(row["group_id"], set()).add((row["training_step"], row["prompt"]))
        assert row["group_id"].startswith(f"{GRPO}:")
    assert len(by_group) == 4  # 2 logging steps x 2 prompts
    assert all(len(members) == 1 for members in by_group.values())
    assert sorted(len([r for r in rows if r["group_id"] == g]) for g in by_group) == [2, 2, 2, 2]


def test_the_weights_come_from_args_json_or_the_option(tmp_path):
    """Without args.json every function weighs 1; --reward-weights wins over args.json."""
    alone = tmp_path / "completions.jsonl"
    shutil.copy(GRPO, alone)
    t = lines(GRPO)[0]
    plain = read(alone)[0]
    assert plain["reward"] == pytest.approx(t["HasE"][0] + t["Brevity"][0], abs=1e-15)
    chosen = read(GRPO, weights=(2.0, 0.0))[0]
    assert chosen["reward"] == pytest.approx(2.0 * t["HasE"][0], abs=1e-15)


def test_a_missing_reward_is_not_applicable(tmp_path):
    """ms-swift sums the functions with nansum: a function that gives NaN (or null) counts 0."""
    t = lines(GRPO)[0]
    t["Brevity"][0] = None
    t["HasE"][1] = float("nan")
    path = tmp_path / "completions.jsonl"
    path.write_text(json.dumps(t) + "\n")
    rows = read(path)
    assert rows[0]["reward"] == t["HasE"][0] and math.isnan(rows[0]["reward_Brevity"])
    assert rows[1]["reward"] == t["Brevity"][1] and math.isnan(rows[1]["reward_HasE"])


def test_the_megatron_table_has_gen_step(tmp_path):
    t = lines(GRPO)[0]
    t = {"gen_step": [5] * len(t["prompt"]), **{k: v for k, v in t.items() if k != "step"}}
    path = tmp_path / "completions.jsonl"
    path.write_text(json.dumps(t) + "\n")
    rows = read(path)
    assert [r["training_step"] for r in rows] == [5] * len(rows)
    assert [r["reward_HasE"] for r in rows] == t["HasE"]


def test_every_value_of_the_ray_driver_lines():
    records = lines(RAY)
    rows = read(RAY)
    assert len(rows) == len(records)
    for number, (row, record) in enumerate(zip(rows, records), start=1):
        assert row["traj_id"] == f"{RAY}:{number}"
        assert row["prompt"] == record["prompt"] and row["action"] == record["completion"]
        assert row["reward"] == row["episode_reward"] == record["reward"]
        assert row["training_step"] == record["gen_step"]
    # the same completions as the table's first line, the same groups
    table = read(GRPO)[: len(rows)]
    assert [r["reward"] for r in rows] == pytest.approx([r["reward"] for r in table], abs=1e-7)
    assert len({r["group_id"] for r in rows}) == len({r["group_id"] for r in table}) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("step"), "line 1: field 'step': missing"),
        (lambda t: t.update(completion=t["completion"][:-1]), "line 1: field 'completion': must be a list of 4 values"),
        (
            lambda t: t["prompt"].__setitem__(1, 5),
            "line 1, completion 1: field 'prompt': must be text or a list of chat",
        ),
        (lambda t: t["HasE"].__setitem__(2, "yes"), "line 1, completion 2: field 'HasE': must be a number"),
        (lambda t: t["step"].__setitem__(0, "one"), "line 1, completion 0: field 'step': must be an integer"),
        (lambda t: t["completion"].__setitem__(3, None), "line 1, completion 3: field 'completion': must be text"),
    ],
)
def test_a_bad_table_names_file_line_and_field(tmp_path, change, message):
    t = lines(GRPO)[0]
    change(t)
    path = tmp_path / "completions.jsonl"
    path.write_text(json.dumps(t) + "\n")
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_weights_that_do_not_fit_the_functions(tmp_path):
    with pytest.raises(
        GacaError, match=r"line 1: --reward-weights gives 3 weights for the 2 reward functions HasE, Brevity"
    ):
        read(GRPO, weights=(1.0, 1.0, 1.0))
    (tmp_path / "args.json").write_text('{"reward_weights": [1.0]}')
    shutil.copy(GRPO, tmp_path / "completions.jsonl")
    with pytest.raises(GacaError, match=r"args\.json \(reward_weights\) gives 1 weights for the 2 reward functions"):
        read(tmp_path / "completions.jsonl")
    (tmp_path / "args.json").write_text('{"reward_weights": ["high", 1.0]}')
    with pytest.raises(GacaError, match=r"args\.json: field 'reward_weights': must be a number"):
        read(tmp_path / "completions.jsonl")
    (tmp_path / "args.json").write_text('{"reward_weights": [NaN, 1.0]}')  # Python's json.dump writes NaN
    with pytest.raises(GacaError, match=r"args\.json: field 'reward_weights': must be finite numbers"):
        read(tmp_path / "completions.jsonl")


def test_reward_weights_that_are_not_finite_are_a_usage_error(tmp_path):
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "swift", str(GRPO), "-o", str(out), "--reward-weights", "nan,1"])
    assert res.exit_code == 2, res.output
    message = " ".join(res.stderr.split())
    assert "'--reward-weights'" in message and "'nan' in 'nan,1' is not a finite number" in message, message
    assert not out.exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 1: not valid JSON"),
        ("[1, 2]", "line 1: expected a JSON object"),
        ('{"gen_step": 1, "prompt": "p", "completion": "c"}', "line 1: field 'reward': missing"),
        ('{"gen_step": 1, "prompt": "p", "reward": 1}', "line 1: field 'completion': missing"),
        (
            '{"gen_step": "x", "prompt": "p", "completion": "c", "reward": 1}',
            "line 1: field 'gen_step': must be an integer",
        ),
    ],
)
def test_a_bad_line_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "completions.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_logged_fields_named_like_columns_gaca_writes_are_kept_as_source_names(tmp_path):
    """Nothing the run logged is dropped: a field named like one of the row's columns (or
    `extra`, which holds the nested fields) is kept as source_<name>."""
    path = tmp_path / "completions.jsonl"
    line = {
        "gen_step": 1,
        "prompt": "p",
        "completion": "c",
        "reward": 1,
        "traj_id": "mine",
        "extra": 3,
        "env": {"k": 1},
    }
    path.write_text(json.dumps(line) + "\n")
    [row] = read(path)
    assert row["traj_id"] == f"{path}:1" and row["source_traj_id"] == "mine"
    assert row["source_extra"] == 3 and row["extra"] == {"env": {"k": 1}}
    path.write_text(json.dumps({**line, "source_extra": 4}) + "\n")
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: line 1: field 'extra': is kept as 'source_extra'")


# --- the command end to end -------------------------------------------------------------


def test_gaca_import_from_swift_end_to_end(tmp_path):
    """A run's output directory: completions.jsonl is read, args.json gives the weights,
    logging.jsonl (ms-swift's metrics) is not a completions file and is left alone."""
    run = tmp_path / "v0-20261201"
    shutil.copytree(DATA / "grpo", run)
    (run / "logging.jsonl").write_text('{"loss": 0.1, "global_step/max_steps": "1/2"}\n')
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "swift", str(run), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert (summary["files"], summary["rows"], summary["groups"]) == (1, 8, 4)
    got = pq.read_table(out).to_pylist()
    want = read(run / "completions.jsonl")
    assert len(got) == len(want)
    for a, b in zip(sorted(got, key=lambda r: r["traj_id"]), sorted(want, key=lambda r: r["traj_id"])):
        assert a == {**b, "traj_id": a["traj_id"]} and a["traj_id"] == b["traj_id"]
    adv = runner.invoke(app, ["advantages", str(out), "--method", "grpo", "-o", str(tmp_path / "adv.parquet")])
    assert adv.exit_code == 0, adv.output


def test_gaca_import_from_swift_bad_input_writes_nothing(tmp_path):
    t = lines(GRPO)[0]
    t["Brevity"][1] = "short"
    bad = tmp_path / "completions.jsonl"
    bad.write_text(json.dumps(t) + "\n")
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "swift", str(bad), "-o", str(out)])
    assert res.exit_code == 1
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {bad}: line 1, completion 1: field 'Brevity': must be a number, got \"short\""]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]


# --- the layouts of earlier releases (versions/, written by make_fixture_versions.py) ----

VERSIONS = DATA / "versions"
#: each release's keys: 3.1 and 3.2 the chat messages and the weighted total `reward`, 3.3 and 3.4 the
#: prompt as chat messages and no advantages, 3.5 and 3.6 the templated prompt, 3.7 `advantage`
#: (and entropy), 3.8 on the layout of 4.x
LAYOUTS = {
    "3.1.1.post1": ["step", "messages", "completion", "reward"],
    "3.2.2": ["step", "messages", "completion", "reward"],
    "3.4.1": ["step", "prompt", "completion", "HasE", "Brevity"],
    "3.5.3": ["step", "prompt", "completion", "HasE", "Brevity"],
    "3.7.3": ["step", "prompt", "completion", "HasE", "Brevity", "advantage", "entropy"],
    "3.12.6": ["step", "prompt", "completion", "HasE", "Brevity", "advantages", "entropy", "solution"],
}


def test_a_fixture_for_each_release_layout():
    assert sorted(p.name for p in VERSIONS.iterdir() if p.is_dir()) == sorted(LAYOUTS)


@pytest.mark.parametrize("version", [v for v in LAYOUTS if "reward" not in LAYOUTS[v]])
def test_every_value_of_each_release(version):
    path = VERSIONS / version / "completions.jsonl"
    table = lines(path)
    assert [list(t) for t in table] == [LAYOUTS[version]] * len(table)
    assert json.loads((path.parent / "args.json").read_text())["reward_weights"] == list(WEIGHTS)
    kept = [(n, t) for n, t in enumerate(table, start=1) if n == 1 or t != table[n - 2]]
    assert len(kept) == 2  # two logging steps; the end of training logs the last table again
    rows = read(path)
    assert len(rows) == sum(len(t["prompt"]) for _, t in kept)
    it = iter(rows)
    for number, t in kept:
        advantages = t.get("advantages", t.get("advantage"))
        for i in range(len(t["prompt"])):
            row = next(it)
            assert row["traj_id"] == f"{path}:{number}:{i}" and row["step_idx"] == 0 and row["done"] is True
            context, other = ("prompt", "messages") if isinstance(t["prompt"][i], str) else ("messages", "prompt")
            assert row[context] == t["prompt"][i] and other not in row
            assert row["action"] == t["completion"][i]
            reward = WEIGHTS[0] * t["HasE"][i] + WEIGHTS[1] * t["Brevity"][i]
            assert row["reward"] == row["episode_reward"] == pytest.approx(reward, abs=1e-15)
            assert (row["reward_HasE"], row["reward_Brevity"]) == (t["HasE"][i], t["Brevity"][i])
            assert row.get("source_advantage") == (advantages[i] if advantages else None)
            assert row["training_step"] == int(t["step"][i])
            assert {k: row[k] for k in ("entropy", "solution") if k in t} == {
                k: t[k][i] for k in ("entropy", "solution") if k in t
            }
            assert "extra" not in row
    # a group: the completions of one prompt at one logging step (the dataset repeats its two prompts)
    groups = {(r["group_id"], r["training_step"], json.dumps(r.get("prompt", r.get("messages")))) for r in rows}
    assert (
        len(groups) == len({g for g, _, _ in groups}) == len({(n, json.dumps(p)) for n, t in kept for p in t["prompt"]})
    )


@pytest.mark.parametrize("version", LAYOUTS)
def test_each_release_imports_and_gets_grpo_advantages(tmp_path, version):
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "swift", str(VERSIONS / version), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"] == 8
    adv = runner.invoke(app, ["advantages", str(out), "--method", "grpo", "-o", str(tmp_path / "adv.parquet")])
    assert adv.exit_code == 0, adv.output


@pytest.mark.parametrize("version", [v for v in LAYOUTS if "reward" in LAYOUTS[v]])
def test_every_value_of_ms_swift_3_1_and_3_2(tmp_path, version):
    """3.1 and 3.2 log each generation batch once (no repeated line): the messages before the
    completion, and `reward`, the weighted total, which is the row's reward as it is."""
    path = VERSIONS / version / "completions.jsonl"
    table = lines(path)
    assert [list(t) for t in table] == [LAYOUTS[version]] * len(table) and len(table) == 2
    rows = read(path)
    assert len(rows) == 8
    it = iter(rows)
    for number, t in enumerate(table, start=1):
        for i in range(len(t["messages"])):
            row = next(it)
            assert row["traj_id"] == f"{path}:{number}:{i}" and row["step_idx"] == 0 and row["done"] is True
            assert row["messages"] == t["messages"][i] and "prompt" not in row
            assert row["action"] == t["completion"][i]
            assert row["reward"] == row["episode_reward"] == t["reward"][i]
            assert row["training_step"] == int(t["step"][i])
            assert not [k for k in row if k.startswith(("reward_", "source_"))] and "extra" not in row
    # the first completion: HasE 1.0, Brevity -0.13, weighted by args.json's [1.0, 0.5] in float32
    assert rows[0]["reward"] == pytest.approx(1.0 * 1.0 + 0.5 * -0.13, abs=1e-7)
    groups = {(r["group_id"], json.dumps(r["messages"])) for r in rows}
    assert len(groups) == len({g for g, _ in groups}) == 4  # two prompts at each of two steps
    # the logged total is not weighted again: neither args.json's weights nor --reward-weights apply
    assert [r["reward"] for r in read(path, weights=(2.0, 3.0))] == [r["reward"] for r in rows]
    bad = tmp_path / "completions.jsonl"
    bad.write_text(json.dumps({k: v for k, v in table[0].items() if k != "reward"}) + "\n")
    with pytest.raises(GacaError, match="line 1: field 'reward': missing"):
        read(bad)
