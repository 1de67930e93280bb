"""`--from rllm`: the rows read from episodes rLLM's own serialisers wrote (tests/data/rllm/:
EpisodeLogger files and Episode.to_dict() dumps), checked value by value against the files read
here with json, and the command end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.errors import GacaError
from gaca_cli.integrations.imports import rllm
from gaca_cli.integrations.imports.base import ImportOptions, expand_sources

DATA = Path(__file__).resolve().parents[1] / "data" / "rllm"
LOGGED = DATA / "episodes" / "train_step_3_epoch_0"
TO_DICT = DATA / "to_dict"
runner = CliRunner()


def read(*sources: Path) -> list[dict]:
    return list(rllm.read(expand_sources(sources, rllm.INFO.suffixes), ImportOptions()))


def episode_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.json") if p.name != "batch_summary.json")


def text(content) -> str:
    return "" if content is None else content


def check_step(row: dict, step: dict) -> None:
    """The columns both kinds of file give, against the step's JSON."""
    chat = step["chat_completions"]
    assert chat[-1]["role"] == "assistant"
    assert row["messages"] == [{"role": m["role"], "content": text(m["content"])} for m in chat[:-1]]
    assert row["action"] == chat[-1]["content"]
    assert row["reward"] == step["reward"]
    assert row["done"] is step["done"]
    assert row["observation"] == step["observation"]
    assert row["parsed_action"] == step["action"]
    assert row["thought"] == step["thought"]
    assert row["model_response"] == step["model_response"]


VERSIONS = DATA / "versions"
#: the EpisodeLogger folders: the main fixture's and those of each release line that has the logger
LOGGED_DIRS = [LOGGED, *sorted(VERSIONS.glob("*/episodes/train_step_3_epoch_0"))]
#: Episode.to_dict() dumps: one episode a file, or a list of them in one (as rLLM's examples save a run)
DUMPS = [TO_DICT, *sorted(VERSIONS.glob("*/results.json"))]


def dumped(source: Path) -> list[tuple[str, dict]]:
    """(the traj_id prefix, the episode) for each episode of a dump folder or list file."""
    if source.is_dir():
        return [(f"{path}:", json.loads(path.read_text())) for path in episode_files(source)]
    return [(f"{source}:[{j}].", episode) for j, episode in enumerate(json.loads(source.read_text()))]


@pytest.mark.parametrize("directory", LOGGED_DIRS, ids=lambda d: d.parents[1].name)
def test_every_value_of_the_episode_logger_files(directory):
    files = episode_files(directory)
    rows = read(directory)
    assert len(rows) == sum(len(t["steps"]) for f in files for t in json.loads(f.read_text())["trajectories"])
    for path in files:
        episode = json.loads(path.read_text())
        task_id = episode["episode_id"].split(":")[0]
        for k, trajectory in enumerate(episode["trajectories"]):
            steps = [r for r in rows if r["traj_id"] == f"{path}:t{k}"]
            assert [r["step_idx"] for r in steps] == list(range(len(trajectory["steps"])))
            for row, step in zip(steps, trajectory["steps"]):
                check_step(row, step)
                assert row["group_id"] == f"{directory}/{task_id}:{trajectory['name']}"
                assert row["episode_reward"] == trajectory["reward"]
                assert row["traj_name"] == trajectory["name"]
                assert row["traj_uid"] == trajectory["uid"]
                assert row["num_steps"] == trajectory["num_steps"]
                assert row["episode_id"] == episode["episode_id"]
                assert row["success"] is episode["is_correct"]
                for key in ("termination_reason", "training_step", "epoch", "task_hash"):
                    assert row[key] == episode[key]
                assert row.get("session_id") == episode.get("session_id")  # main's logger writes it
                assert "prompt_token_ids" not in row and "behavior_logprobs" not in row
                extra = row["extra"]
                assert extra["episode"]["task"] == episode["task"]
                assert extra["episode"]["metrics"] == episode["metrics"]
                assert extra["episode"].get("timing") == (episode["timing"] or None)
                assert extra["episode"].get("metadata") == (episode.get("metadata") or None)
                assert extra.get("trajectory", {}).get("timing") == (trajectory["timing"] or None)
                assert extra.get("step", {}).get("timing") == (step["timing"] or None)


@pytest.mark.parametrize("source", DUMPS, ids=lambda p: p.parent.name if p.is_file() else p.name)
def test_every_value_of_the_to_dict_files(source):
    rows = read(source)
    folder = source if source.is_dir() else source.parent
    episodes = dumped(source)
    assert len(rows) == sum(len(t["steps"]) for _, e in episodes for t in e["trajectories"])
    for prefix, episode in episodes:
        for k, trajectory in enumerate(episode["trajectories"]):
            steps = [r for r in rows if r["traj_id"] == f"{prefix}t{k}"]
            assert len(steps) == len(trajectory["steps"])
            for row, step in zip(steps, trajectory["steps"]):
                check_step(row, step)
                assert row["group_id"] == f"{folder}/{episode['id'].split(':')[0]}:{trajectory['name']}"
                assert row["episode_id"] == episode["id"]
                assert row["success"] is episode["is_correct"]
                assert row["termination_reason"] == episode["termination_reason"]
                assert row["episode_reward"] == trajectory["reward"]
                # 0.2.0's Step has no token ids: its model_output's are kept in extra
                assert row.get("prompt_token_ids") == (step.get("prompt_ids") or None)
                assert row.get("action_token_ids") == (step.get("response_ids") or None)
                assert row.get("behavior_logprobs") == (step.get("logprobs") or None)
                assert row.get("source_advantage") == step.get("advantage")
                assert row["mc_return"] == step["mc_return"]
                assert row.get("weight_version") == step.get("weight_version")
                assert row.get("session_id") == episode.get("session_id")
                extra = row["extra"]
                assert extra["episode"]["task"] == episode["task"]
                assert extra["episode"].get("info") == (episode["info"] or None)
                assert extra.get("trajectory", {}).get("task") == trajectory["task"]
                assert extra.get("step", {}).get("info") == (step["info"] or None)
                if step.get("model_output"):
                    output = extra["step"]["model_output"]
                    assert output.get("prompt_ids", row.get("prompt_token_ids")) == step["model_output"]["prompt_ids"]
                    assert output["finish_reason"] == step["model_output"]["finish_reason"]


@pytest.mark.parametrize("source", DUMPS, ids=lambda p: p.parent.name if p.is_file() else p.name)
def test_groups_are_one_task_and_one_agent(source):
    """The FrozenLake rollouts form one group; the solver/judge episodes give one group per role."""
    groups: dict[str, set[str]] = {}
    for row in read(source):
        groups.setdefault(row["group_id"], set()).add(row["traj_id"])
    lake = {"lake-3:frozenlake_agent": 3} if source == TO_DICT else {"lake-5:frozenlake_agent": 2}
    assert {g.rsplit("/", 1)[1]: len(t) for g, t in groups.items()} == {**lake, "math-17:solver": 2, "math-17:judge": 2}


@pytest.mark.parametrize(
    ("logged", "dump"),
    [(LOGGED, TO_DICT), *[(d, d.parents[1] / "results.json") for d in LOGGED_DIRS[1:]]],
    ids=lambda p: p.parents[1].name if p.name.startswith("train_step") else None,
)
def test_both_files_of_an_episode_agree(logged, dump):
    """The logger's file and to_dict's of the same episode give the same chat, rewards and flags."""
    columns = ("step_idx", "reward", "done", "messages", "action", "observation", "parsed_action", "episode_reward")
    by_logger = {(r["episode_id"], r["traj_name"], r["step_idx"]): r for r in read(logged)}
    dumped = {(r["episode_id"], r["traj_name"], r["step_idx"]): r for r in read(dump)}
    assert by_logger.keys() == dumped.keys()
    for key, row in by_logger.items():
        assert {c: row[c] for c in columns} == {c: dumped[key][c] for c in columns}


def test_the_cut_off_rollout_has_no_done_step():
    rows = [r for r in read(TO_DICT) if r["episode_id"] == "lake-3:2"]
    assert [r["done"] for r in rows] == [False, False]
    assert rows[0]["termination_reason"] == "max_turns_exceeded" and rows[0]["success"] is False


def test_a_null_done_reads_as_absent(tmp_path):
    """`"done": null`, as a JSON writer puts an unset optional field: False, rllm's default."""
    path = _broken(tmp_path, lambda e: _step(e).update(done=None))
    assert [r["done"] for r in read(path)] == [
        r["done"] for r in read(_broken(tmp_path, lambda e: _step(e).pop("done")))
    ]


def test_batch_summary_is_passed_over():
    assert read(LOGGED / "batch_summary.json") == []


def test_a_chat_without_the_answer_takes_model_response(tmp_path):
    episode = json.loads((TO_DICT / "math-17_0.json").read_text())
    step = episode["trajectories"][0]["steps"][0]
    step["chat_completions"] = step["chat_completions"][:-1]
    path = tmp_path / "e.json"
    path.write_text(json.dumps(episode))
    row = read(path)[0]
    assert row["messages"] == [{"role": "user", "content": "What is 17 + 25?"}]
    assert row["action"] == step["model_response"] == "42"


def test_a_trajectory_without_a_reward_returns_the_sum_of_its_steps(tmp_path):
    """rLLM allows `Trajectory.reward = None`; episode_reward (which must have no null) is then
    the sum of the step rewards, gaca's own default return."""
    episode = json.loads((TO_DICT / "lake-3_1.json").read_text())
    episode["trajectories"][0]["reward"] = None
    episode["trajectories"][0]["steps"][0]["reward"] = 0.25
    path = tmp_path / "e.json"
    path.write_text(json.dumps(episode))
    assert [r["episode_reward"] for r in read(path)] == [1.25, 1.25, 1.25]


def _changed(tmp_path: Path, change, source: Path = TO_DICT / "lake-3_0.json") -> Path:
    """An episode file rLLM wrote, loaded, changed by `change(episode)` and written again."""
    episode = json.loads(source.read_text())
    change(episode)
    path = tmp_path / source.name
    path.write_text(json.dumps(episode))
    return path


def test_step_fields_named_like_gaca_columns_are_kept_as_source_names(tmp_path):
    """A step's scalar `extra` and its fields named like gaca's columns are kept as
    source_<name>; gaca's own values (and the JSON column `extra`) stay what they are."""
    mine = {"extra": "note", "traj_id": "t-9", "step_idx": 7, "group_id": "g-1", "episode_reward": 0.5}

    def change(e: dict) -> None:
        e["trajectories"][0]["steps"][0].update(mine)

    path = _changed(tmp_path, change)
    row = read(path)[0]
    assert {k: row[f"source_{k}"] for k in mine} == mine
    assert (row["traj_id"], row["step_idx"], row["episode_reward"]) == (f"{path}:t0", 0, 1.0)
    assert row["group_id"] == f"{tmp_path}/lake-3:frozenlake_agent"
    assert row["extra"]["step"] == {"info": {"timing": {"llm_s": 0.5}}}


def test_each_levels_fields_keep_their_own_column(tmp_path):
    """A scalar of one name at the episode, the trajectory and the step (rLLM's `task` given as
    text at the two upper levels, a `score` at all three): the step's keeps the name, the
    trajectory's is trajectory_<name>, the episode's episode_<name>, on every step."""

    def change(e: dict) -> None:
        e.update(task="2x2 lake, seed 3", score=0.9, reward=1.0)
        e["trajectories"][0].update(task="2x2 lake, seed 3", score=0.8, done=True)
        for i, step in enumerate(e["trajectories"][0]["steps"]):
            step["score"] = float(i)

    rows = read(_changed(tmp_path, change))
    assert [r["score"] for r in rows] == [0.0, 1.0]
    for row in rows:
        assert (row["trajectory_score"], row["episode_score"]) == (0.8, 0.9)
        assert row["trajectory_task"] == row["episode_task"] == "2x2 lake, seed 3"
        assert row["trajectory_done"] is True and row["source_episode_reward"] == 1.0
        assert row["episode_reward"] == 1.0  # the trajectory's reward, gaca's column
        assert "task" not in row and "task" not in row["extra"]["trajectory"]
    assert [r["done"] for r in rows] == [False, True]


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (
            lambda e: _step(e, 1).update(source_advantage=0.25),
            "advantage",
            "is kept as 'source_advantage' because gaca writes a column 'advantage', but the record also gives "
            "'source_advantage'; rename one of the two in the source",
        ),
        (
            lambda e: _step(e, 1).update(extra="note", source_extra="other"),
            "extra",
            "is kept as 'source_extra' because gaca writes a column 'extra', but the record also gives "
            "'source_extra'; rename one of the two in the source",
        ),
        (
            lambda e: (e["trajectories"][0].update(score=0.8), _step(e, 1).update(trajectory_score=0.5)),
            "trajectory_score",
            "the trajectory's field 'score' is kept as 'trajectory_score', but the step also gives "
            "'trajectory_score'; rename one of the two in the source",
        ),
    ],
    ids=["advantage", "extra", "trajectory"],
)
def test_a_field_that_would_share_a_column_is_one_error(tmp_path, change, field, message):
    """Two fields that would be kept as one column: the import stops with one line naming the
    file, the step and the field, and writes nothing, rather than keep only one of them."""
    path = _changed(tmp_path, change)
    expected = f"{path}: trajectories[0].steps[1]: field '{field}': {message}"
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value) == expected
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "rllm", str(path), "-o", str(out)])
    assert res.exit_code == 1
    assert [line for line in res.output.splitlines() if line.startswith("Error:")] == [f"Error: {expected}"]
    assert not out.exists()


def test_the_renamed_columns_reach_the_log(tmp_path):
    """End to end, from an EpisodeLogger file: the step's, trajectory's and episode's fields of
    one name are three columns of the log."""

    def change(e: dict) -> None:
        e["session_id"] = "sess-1"
        e["extra"] = "episode note"
        e["trajectories"][0]["extra"] = "trajectory note"
        e["trajectories"][0]["steps"][0]["extra"] = "step note"

    path = _changed(tmp_path, change, episode_files(LOGGED)[0])
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "rllm", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    row = pq.read_table(out).to_pylist()[0]
    assert (row["source_extra"], row["trajectory_extra"], row["episode_extra"]) == (
        "step note",
        "trajectory note",
        "episode note",
    )
    assert json.loads(row["extra"])["episode"]["task"] == json.loads(path.read_text())["task"]


def _broken(tmp_path: Path, change) -> Path:
    episode = json.loads((TO_DICT / "lake-3_1.json").read_text())
    change(episode)
    path = tmp_path / "lake-3_1.json"
    path.write_text(json.dumps(episode))
    return path


def _step(e: dict, i: int = 1) -> dict:
    return e["trajectories"][0]["steps"][i]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e.pop("id"), "field 'episode_id': missing"),
        (lambda e: e.update(trajectories={}), "field 'trajectories': must be a list"),
        (lambda e: e.update(is_correct="yes"), "field 'is_correct': must be true or false"),
        (lambda e: e["trajectories"][0].update(steps=[]), "trajectories[0]: field 'steps': missing or empty"),
        (lambda e: e["trajectories"][0].update(reward="high"), "trajectories[0]: field 'reward': must be a number"),
        (lambda e: _step(e).pop("reward"), "trajectories[0].steps[1]: field 'reward': missing"),
        (lambda e: _step(e).update(done=1), "trajectories[0].steps[1]: field 'done': must be true or false"),
        (
            lambda e: _step(e).update(reward=-(10**400)),
            "trajectories[0].steps[1]: field 'reward': is an integer of 401",
        ),
        (
            lambda e: _step(e).update(chat_completions="hello"),
            "trajectories[0].steps[1]: field 'chat_completions': must be a list of chat messages",
        ),
        (
            lambda e: _step(e).update(chat_completions=[], model_response=""),
            "trajectories[0].steps[1]: field 'chat_completions': empty, and no model_response",
        ),
        (
            lambda e: _step(e).update(logprobs=[-0.1]),
            "trajectories[0].steps[1]: field 'logprobs': has 1 values for 2 response_ids",
        ),
        (
            lambda e: _step(e, 2).update(prompt_ids="1 2 3"),
            "trajectories[0].steps[2]: field 'prompt_ids': must be a list, got \"1 2 3\"",
        ),
    ],
)
def test_a_bad_episode_names_file_place_and_field(tmp_path, change, message):
    path = _broken(tmp_path, change)
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_a_broken_episode_of_a_list_names_its_place(tmp_path):
    """A dump of a whole run (`json.dump([e.to_dict() for e in results])`): the error names the
    episode's place in the list."""
    episodes = json.loads((VERSIONS / "v0.3.0-pre" / "results.json").read_text())
    episodes[1]["trajectories"][0]["steps"][1].pop("reward")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(episodes))
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value) == f"{path}: [1].trajectories[0].steps[1]: field 'reward': missing"


def test_a_file_that_is_not_json_names_its_line(tmp_path):
    path = tmp_path / "e.json"
    path.write_text('{\n  "id": "x:0",\n  "trajectories": [,]\n}\n')
    with pytest.raises(GacaError, match=r"e\.json: line 3: not valid JSON"):
        read(path)


# --- the command end to end -------------------------------------------------------------


def test_gaca_import_from_rllm_end_to_end(tmp_path):
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "rllm", str(TO_DICT), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert (summary["rows"], summary["trajectories"], summary["groups"]) == (11, 7, 3)
    got = sorted(pq.read_table(out).to_pylist(), key=lambda r: (r["traj_id"], r["step_idx"]))
    want = sorted(read(TO_DICT), key=lambda r: (r["traj_id"], r["step_idx"]))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for key in ("group_id", "reward", "episode_reward", "done", "messages", "action", "observation"):
            assert a[key] == b[key]
        assert a["action_token_ids"] == b.get("action_token_ids")
        assert a["behavior_logprobs"] == (pytest.approx(b["behavior_logprobs"]) if "behavior_logprobs" in b else None)
        assert a["source_advantage"] == b.get("source_advantage")
        assert json.loads(a["extra"]) == b["extra"]


def test_the_observation_is_gigpos_anchor_with_map(tmp_path):
    """The FrozenLake rollouts log an observation at every step: `--map anchor_obs=observation`
    gives GiGPO its step groups (the rollouts start on the same grid). The solver/judge
    steps have none: the same command refuses the null anchors, naming the rows."""
    lake = tmp_path / "lake.parquet"
    res = runner.invoke(app, ["import", "--from", "rllm", str(TO_DICT / "lake-*.json"), "-o", str(lake)])
    assert res.exit_code == 0, res.output
    adv = tmp_path / "adv.parquet"
    args = ["advantages", str(lake), "--method", "gigpo", "--map", "anchor_obs=observation", "-o", str(adv)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    table = pq.read_table(adv).to_pylist()
    first = [r["step_group_size"] for r in table if r["step_idx"] == 0]
    # the start grid: step 0 of the three rollouts, and step 1 of the two that bumped into the
    # lake's edge (LEFT, UP) and stayed where they were
    assert first == [5, 5, 5]
    everything = tmp_path / "all.parquet"
    assert runner.invoke(app, ["import", "--from", "rllm", str(TO_DICT), "-o", str(everything)]).exit_code == 0
    res = runner.invoke(app, ["advantages", str(everything), "--method", "gigpo", "--map", "anchor_obs=observation"])
    assert res.exit_code == 1
    assert "column 'observation': must not be null" in res.output


def test_a_torch_save_pickle_is_one_error(tmp_path):
    """rLLM 0.1's only saving code, `save_trajectories` (in every later version too), pickles the
    Trajectory objects with torch.save: one Error line, nothing written."""
    path = VERSIONS / "v0.1" / "trajectories.pt"
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "rllm", str(path), "-o", str(out)])
    assert res.exit_code == 1
    assert [line for line in res.output.splitlines() if line.startswith("Error:")] == [
        f"Error: {path}: a torch.save pickle (rLLM's save_trajectories writes one), which gaca does not unpickle: "
        "save the episodes as JSON (EpisodeLogger, or json.dump of Episode.to_dict(), rLLM 0.2.0 and later) and "
        "import those"
    ]
    assert not out.exists() and "Traceback" not in res.output


def test_gaca_import_from_rllm_bad_input_writes_nothing(tmp_path):
    path = _broken(tmp_path, lambda e: _step(e).pop("reward"))
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "rllm", str(path), "-o", str(out)])
    assert res.exit_code == 1
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {path}: trajectories[0].steps[1]: field 'reward': missing"]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [path]
