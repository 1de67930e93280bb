"""`gaca import --from verifiers`: vf-eval results.jsonl + metadata.json (verifiers 0.1-0.3) and
traces.jsonl (verifiers 0.4), from tests/data/verifiers.

The fixtures were written by verifiers' own code (0.3.1 `save_outputs` / `save_metadata`;
0.4.0 `prepare_turn` / `PendingTurn.commit` / `write_episode`; older release lines); three
real vf-eval runs committed in the verifiers repository are tested where the shared folder
beside the checkout holds them. Every value is checked against the files read here with `json`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gaca_cli.integrations.imports import verifiers
from gaca_cli.integrations.imports.base import ImportOptions, SourceError
from tests.integrations.cli_helpers import error_line, gaca, import_json

RUN = Path(__file__).parents[1] / "data" / "verifiers" / "evals" / "math-tools--tiny-model" / "run0"
RESULTS = RUN / "results.jsonl"


def records() -> list[dict]:
    return [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]


def read(*paths: Path) -> list[dict]:
    return list(verifiers.read(list(paths), ImportOptions()))


def by_traj(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["traj_id"], []).append(r)
    return out


def test_every_rollout_field_is_mapped():
    metadata = json.loads((RUN / "metadata.json").read_text())
    trajs = by_traj(read(RESULTS))
    source = records()
    assert len(trajs) == len(source) == 4
    for n, rec in enumerate(source, start=1):
        steps = trajs[f"{RESULTS}:{n}"]
        assistant_turns = [m for m in rec["completion"] if m["role"] == "assistant"]
        assert [s["step_idx"] for s in steps] == list(range(len(assistant_turns)))
        for s in steps:
            assert s["group_id"] == f"{RESULTS}:{rec['example_id']}"
            assert s["example_id"] == rec["example_id"]
            assert s["episode_reward"] == rec["reward"]
            assert s["answer"] == rec["answer"] and s["task"] == rec["task"]
            assert s["is_completed"] == rec["is_completed"] and s["is_truncated"] == rec["is_truncated"]
            assert s["stop_condition"] == rec["stop_condition"]
            assert {k: v for k, v in s.items() if k.startswith("metric_")} == {
                f"metric_{k}": v for k, v in rec["metrics"].items()
            }
            assert s["env_id"] == metadata["env_id"] and s["model"] == metadata["model"]
            assert "correct" not in s  # the metrics repeated at the top level are not copied twice
        assert [s["reward"] for s in steps] == [0.0] * (len(steps) - 1) + [rec["reward"]]
        assert [s["done"] for s in steps] == [False] * (len(steps) - 1) + [rec["is_completed"]]
        fields = {
            str(i): {"tool_call_id": m["tool_call_id"]}
            for i, m in enumerate(rec["prompt"] + rec["completion"])
            if m.get("tool_call_id")
        }
        assert steps[-1]["extra"] == {
            "info": rec["info"],
            "timing": rec["timing"],
            **({"message_fields": fields} if fields else {}),
        }
        assert all("extra" not in s for s in steps[:-1])


def test_turns_split_with_the_chat_before_them():
    """Context of a turn = the prompt + the completion before it; an action is the turn's text,
    its tool calls (saved by verifiers as JSON strings) appended as JSON objects."""
    source = records()
    trajs = by_traj(read(RESULTS))
    single = trajs[f"{RESULTS}:1"]
    assert single[0]["messages"] == source[0]["prompt"]
    assert single[0]["action"] == "5"

    tools = trajs[f"{RESULTS}:3"]
    rec = source[2]
    call = json.loads(rec["completion"][0]["tool_calls"][0])
    assert tools[0]["messages"] == rec["prompt"]
    assert tools[0]["action"] == json.dumps([call], sort_keys=True)
    assert tools[1]["messages"] == [
        *rec["prompt"],
        {"role": "assistant", "content": tools[0]["action"]},
        {"role": "tool", "content": rec["completion"][1]["content"]},
    ]
    assert tools[1]["action"] == rec["completion"][2]["content"]

    cut = trajs[f"{RESULTS}:4"]  # truncated after a tool result: one turn, not done
    assert len(cut) == 1 and cut[0]["done"] is False
    assert cut[0]["action"].startswith("Let me compute.\n[")


def test_few_shot_assistant_turns_in_the_prompt_are_context(tmp_path):
    rec = records()[0]
    shots = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    rec["prompt"] = [rec["prompt"][0], *shots, rec["prompt"][1]]
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    rows = read(path)
    assert len(rows) == 1 and rows[0]["messages"] == rec["prompt"] and rows[0]["action"] == "5"
    assert "env_id" not in rows[0]  # no metadata.json beside this file


def test_completion_environment_strings(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"example_id": 3, "prompt": "2+2=", "completion": "4", "reward": 1.0}) + "\n")
    (row,) = read(path)
    assert (row["prompt"], row["action"], row["reward"], row["done"]) == ("2+2=", "4", 1.0, True)


def test_rollout_without_assistant_turn_is_one_empty_step(tmp_path):
    rec = {**records()[0], "completion": [], "error": {"error": "RuntimeError", "error_chain_repr": "x"}}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (row,) = read(path)
    assert row["action"] == "" and row["messages"] == rec["prompt"]
    assert row["extra"]["error"] == rec["error"]


def test_rollout_fields_named_like_columns_gaca_writes_are_kept_as_source_names(tmp_path):
    """Nothing a rollout holds is dropped: a state column named like one of the row's columns
    (`traj_id`, `done`, `extra`, ...) is kept as source_<name>, not replaced by the row's own."""
    path = tmp_path / "results.jsonl"
    rec = {"example_id": 3, "prompt": "2+2=", "completion": "4", "reward": 1.0}
    path.write_text(json.dumps({**rec, "traj_id": "mine", "done": "no", "extra": 3, "state": {"k": 1}}) + "\n")
    (row,) = read(path)
    assert (row["traj_id"], row["done"]) == (f"{path}:1", True)
    assert (row["source_traj_id"], row["source_done"], row["source_extra"]) == ("mine", "no", 3)
    assert row["extra"] == {"state": {"k": 1}}
    path.write_text(json.dumps({**rec, "traj_id": "mine", "source_traj_id": "also"}) + "\n")
    with pytest.raises(SourceError, match=r"line 1: field 'traj_id': is kept as 'source_traj_id'"):
        read(path)


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        ({"reward": "high"}, "reward", "must be a number"),
        ({"reward": 10**400}, "reward", "is an integer of 401 digits, too large for a number"),
        ({"example_id": None}, "example_id", "missing"),
        ({"example_id": [1]}, "example_id", "must be an integer or a string"),
        ({"completion": [{"content": "no role"}]}, "completion", "must be a list of chat messages ({'role'"),
        ({"metrics": [1.0]}, "metrics", "must be an object"),
        ({"metrics": {"correct": "yes"}}, "metrics.correct", "must be a number"),
    ],
)
def test_bad_rollout_names_file_line_field(tmp_path, change, field, rule):
    good = records()[0]
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
    with pytest.raises(SourceError) as exc:
        read(path)
    assert str(exc.value).startswith(f"{path}: line 2: field '{field}': {rule}")


def test_missing_reward(tmp_path):
    path = tmp_path / "results.jsonl"
    rec = records()[0]
    del rec["reward"]
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(SourceError, match="line 1: field 'reward': missing"):
        read(path)


def test_cli_import_writes_a_valid_log(tmp_path):
    out = tmp_path / "log.parquet"
    import_json("verifiers", RUN.parent.parent, out=out)  # a directory: its results.jsonl files
    table = pq.read_table(out).to_pylist()
    expected = read(RESULTS)
    key = lambda r: (r["traj_id"], r["step_idx"])  # noqa: E731
    assert len(table) == len(expected) == 5
    for got, want in zip(sorted(table, key=key), sorted(expected, key=key)):
        for col in ("group_id", "reward", "episode_reward", "done", "action", "messages", "metric_correct"):
            assert got[col] == want[col], col
    res = gaca("validate", out, "--for", "score")
    assert res.exit_code == 0, res.output


def test_cli_bad_input_one_error_line_and_no_output(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({**records()[0], "reward": "high"}) + "\n")
    out = tmp_path / "log.parquet"
    line = error_line(gaca("import", "--from", "verifiers", path, "-o", out))
    assert "results.jsonl: line 1: field 'reward': must be a number" in line
    assert not out.exists()


# --- verifiers 0.4: traces.jsonl ----------------------------------------------------------

V04 = Path(__file__).parents[1] / "data" / "verifiers" / "v04"
TRACES = V04 / "math-tools--tiny-model--renderer" / "traces.jsonl"
API_TRACES = V04 / "math-tools--tiny-model--api" / "traces.jsonl"


def episodes(path: Path = TRACES) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def chat(message: dict) -> dict:
    """A graph message as a gaca context message: an assistant's tool calls follow its text as JSON."""
    text = message.get("content") or ""
    if message.get("tool_calls"):
        calls = json.dumps(message["tool_calls"], sort_keys=True)
        text = f"{text}\n{calls}" if text else calls
    return {"role": message["role"], "content": text}


def graph_path(nodes: list[dict], i: int) -> list[int]:
    chain = [i]
    while nodes[chain[0]].get("parent") is not None:
        chain.insert(0, nodes[chain[0]]["parent"])
    return chain


def test_v04_every_sampled_node_is_a_step_with_its_path_tokens_and_logprobs():
    trajs = by_traj(read(TRACES))
    source = episodes()
    assert len(source) == 4 and len(trajs) == 4
    for n, episode in enumerate(source, start=1):
        (trace,) = episode["traces"]
        nodes = trace["nodes"]
        steps = trajs[f"{TRACES}:{n}:0"]
        sampled = [i for i, node in enumerate(nodes) if node["sampled"]]
        assert [s["step_idx"] for s in steps] == list(range(len(sampled)))
        for s, i in zip(steps, sampled, strict=True):
            chain = graph_path(nodes, i)
            node = nodes[i]
            assert s["messages"] == [chat(nodes[j]["message"]) for j in chain[:-1]]
            assert s["action"] == chat(node["message"])["content"]
            scaffold = node["mask"].index(True)
            assert (
                s["prompt_token_ids"]
                == [t for j in chain[:-1] for t in nodes[j]["token_ids"]] + node["token_ids"][:scaffold]
            )
            assert s["action_token_ids"] == node["token_ids"][scaffold:] and all(node["mask"][scaffold:])
            assert s["behavior_logprobs"] == node["logprobs"]
            assert len(s["behavior_logprobs"]) == len(s["action_token_ids"])
            assert s["timestamp"] == node["timestamp"]
            (call,) = [c for c in trace["calls"] if c["node"] == i]
            assert (s["model"], s["endpoint"], s["finish_reason"]) == (
                call["model"],
                call["endpoint"],
                call["finish_reason"],
            )
            assert s["extra"]["call"] == {
                k: v for k, v in call.items() if k not in ("node", "model", "endpoint", "finish_reason")
            }


def test_v04_episode_trace_reward_and_task_fields():
    trajs = by_traj(read(TRACES))
    for n, episode in enumerate(episodes(), start=1):
        (trace,) = episode["traces"]
        steps = trajs[f"{TRACES}:{n}:0"]
        total = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        truncated = trace["stop_condition"] == "max_turns"
        for s in steps:
            assert s["group_id"] == f"{TRACES}:{episode['task']['key']}:{trace['agent']['name']}"
            assert s["episode_reward"] == total
            for name, r in trace["rewards"].items():
                assert (s[f"reward_{name}"], s[f"reward_weight_{name}"]) == (r["score"], r["weight"])
            assert {k: v for k, v in s.items() if k.startswith("metric_")} == {
                f"metric_{k}": v for k, v in trace["metrics"].items()
            }
            task = episode["task"]
            assert (s["task_type"], s["task_key"], s["task_hash"]) == (task["type"], task["key"], task["hash"])
            assert (s["task_idx"], s["task_prompt"], s["task_answer"]) == (
                task["data"]["idx"],
                task["data"]["prompt"],
                task["data"]["answer"],
            )
            assert (s["env_id"], s["run_id"], s["run_name"], s["run_type"]) == (
                episode["env"]["id"],
                episode["run"]["id"],
                episode["run"]["name"],
                episode["run"]["type"],
            )
            assert (s["episode_id"], s["episode_ok"], s["episode_num_output_tokens"]) == (
                episode["id"],
                episode["ok"],
                episode["num_output_tokens"],
            )
            assert (s["trace_id"], s["trace_version"], s["verifiers_version"]) == (
                trace["id"],
                trace["version"],
                trace["verifiers"]["version"],
            )
            for key in ("is_completed", "ok", "stop_condition", "is_timeout", "num_input_tokens", "num_output_tokens"):
                assert s[key] == trace[key], key
            assert (s["agent_name"], s["agent_trainable"]) == (trace["agent"]["name"], trace["agent"]["trainable"])
            assert s["is_truncated"] is truncated
        assert [s["reward"] for s in steps] == [0.0] * (len(steps) - 1) + [total]
        assert [s["done"] for s in steps] == [False] * (len(steps) - 1) + [trace["is_completed"] and not truncated]
        last = steps[-1]["extra"]
        assert last["agent_config"] == trace["agent"]["config"]
        assert last["timing"] == trace["timing"] and last["tools"] == trace["tools"]
        assert last["task_network_allow"] == episode["task"]["data"]["network_allow"]
        assert all(k not in s.get("extra", {}) for s in steps[:-1] for k in ("timing", "agent_config"))
    groups = {s["group_id"] for s in read(TRACES)}
    assert len(groups) == 2  # two tasks, two rollouts each


def test_v04_input_nodes_reasoning_and_a_tool_result_after_the_last_turn():
    source = episodes()
    trajs = by_traj(read(TRACES))
    tools = trajs[f"{TRACES}:3:0"]  # tool call, tool result, answer with reasoning
    nodes = source[2]["traces"][0]["nodes"]
    assert tools[1]["extra"]["input_nodes"] == [
        {k: v for k, v in nodes[3].items() if k not in ("token_ids", "mask", "logprobs")}
    ]
    assert tools[1]["reasoning_content"] == nodes[4]["message"]["reasoning_content"]
    cut = trajs[f"{TRACES}:4:0"]  # stopped at max_turns before reading the last tool result
    nodes = source[3]["traces"][0]["nodes"]
    assert cut[-1]["extra"]["nodes_after"] == {"5": nodes[5]}
    assert cut[-1]["extra"]["info"] == source[3]["traces"][0]["info"]
    assert cut[-1]["done"] is False


def test_v04_api_run_has_chats_and_no_tokens():
    rows = read(API_TRACES)
    source = episodes(API_TRACES)
    assert len(rows) == sum(sum(n["sampled"] for n in e["traces"][0]["nodes"]) for e in source) == 4
    for row in rows:
        assert not {"prompt_token_ids", "action_token_ids", "behavior_logprobs"} & row.keys()
        assert row["messages"][:2] == [chat(n["message"]) for n in source[0]["traces"][0]["nodes"][:2]]


def test_v04_unsplittable_mask_keeps_the_tokens_in_extra(tmp_path):
    episode = episodes()[0]
    node = episode["traces"][0]["nodes"][2]
    node["mask"] = [True, False, True]
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(episode) + "\n")
    (row,) = read(path)
    assert not {"prompt_token_ids", "action_token_ids", "behavior_logprobs"} & row.keys()
    assert row["extra"]["node_tokens"] == {k: node[k] for k in ("token_ids", "mask", "logprobs")}


def test_v04_episode_without_traces_is_one_empty_step(tmp_path):
    episode = {**episodes()[0], "traces": [], "ok": False, "errors": [{"type": "SetupError", "message": "no box"}]}
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(episode) + "\n")
    (row,) = read(path)
    assert (row["action"], row["messages"], row["reward"], row["done"]) == ("", [], 0.0, False)
    assert row["extra"]["episode_errors"] == episode["errors"]


def _set(record: dict, dotted: str, value: object) -> None:
    keys = [int(k) if k.isdigit() else k for k in dotted.replace("[", ".").replace("]", "").split(".")]
    target = record
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value


@pytest.mark.parametrize(
    ("field", "value", "reported", "rule"),
    [
        ("task", "t1", "task", "must be an object"),
        ("traces", {}, "traces", "must be a list"),
        ("traces[0].rewards.correct.score", "high", "traces[0].rewards.correct.score", "must be a number"),
        ("traces[0].rewards.format", {"weight": 0.2}, "traces[0].rewards.format.score", "missing"),
        ("traces[0].metrics.num_tool_calls", "two", "traces[0].metrics.num_tool_calls", "must be a number"),
        ("traces[0].nodes[1].parent", 5, "traces[0].nodes[1].parent", "must be the index of an earlier node"),
        ("traces[0].nodes[1].message", {"content": "x"}, "traces[0].nodes[1].message.role", "missing"),
        ("traces[0].nodes[2].token_ids", [1, "a", 3], "traces[0].nodes[2].token_ids[1]", 'must be an integer, got "a"'),
        ("traces[0].nodes[2].mask", [False, True], "traces[0].nodes[2].mask", "must be as long as token_ids"),
        ("traces[0].nodes[2].logprobs", [0.0], "traces[0].nodes[2].logprobs", "must hold one value per"),
        ("traces[0].nodes[0].sampled", True, "traces[0].nodes[0].message", "a sampled node must be an assistant"),
    ],
)
def test_v04_bad_episode_names_file_line_field(tmp_path, field, value, reported, rule):
    good = episodes()[0]
    bad = copy.deepcopy(good)
    _set(bad, field, value)
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SourceError) as exc:
        read(path)
    assert str(exc.value).startswith(f"{path}: line 2: field '{reported}': {rule}")


def test_v04_cli_import_of_a_run_directory_validates(tmp_path):
    out = tmp_path / "log.parquet"
    summary = import_json("verifiers", V04, out=out)  # a directory: its traces.jsonl files
    assert summary
    table = pq.read_table(out).to_pylist()
    expected = read(API_TRACES, TRACES)
    key = lambda r: (r["traj_id"], r["step_idx"])  # noqa: E731
    assert len(table) == len(expected) == 10
    for got, want in zip(sorted(table, key=key), sorted(expected, key=key), strict=True):
        for col in ("group_id", "reward", "episode_reward", "done", "action", "messages", "reward_format"):
            assert got[col] == want[col], col
        for col in ("prompt_token_ids", "action_token_ids"):
            assert got[col] == want.get(col), col
        if "behavior_logprobs" in want:
            assert got["behavior_logprobs"] == pytest.approx(want["behavior_logprobs"], abs=1e-6)
    res = gaca("validate", out)
    assert res.exit_code == 0, res.output
    res = gaca("validate", out, "--for", "score")
    assert res.exit_code == 0, res.output


def test_v04_cli_bad_episode_one_error_line_and_no_output(tmp_path):
    episode = episodes()[0]
    episode["traces"][0]["nodes"][2]["mask"] = [True]
    run = tmp_path / "run"
    run.mkdir()
    (run / "traces.jsonl").write_text(json.dumps(episode) + "\n")
    out = tmp_path / "log.parquet"
    line = error_line(gaca("import", "--from", "verifiers", run, "-o", out))
    assert "traces.jsonl: line 1: field 'traces[0].nodes[2].mask': must be as long as token_ids" in line
    assert not out.exists()


VERSIONS = Path(__file__).parents[1] / "data" / "verifiers" / "versions"


@pytest.mark.parametrize("release", ["0.1.5", "0.1.14", "0.2.1"])
def test_each_release_lines_results_import(tmp_path, release):
    """results.jsonl + metadata.json as each release line's own saving code wrote them
    (tests/data/verifiers/versions): 0.1.0-0.1.5 key a rollout `id` (i // rollouts_per_example
    over rollout-major results: not the example) and the run `env`; later ones `example_id` and
    `env_id`. Every release: two groups of two, the environment named, nothing after the last
    turn lost."""
    results = VERSIONS / release / "results.jsonl"
    out = tmp_path / "out.parquet"
    summary = import_json("verifiers", results, out=out)
    rows = pq.read_table(out).to_pylist()
    assert summary["trajectories"] == 4 and summary["groups"] == 2
    assert {r["env_id"] for r in rows} == {"math-tools"} and {r["model"] for r in rows} == {"tiny-model"}
    groups: dict[str, set[str]] = {}
    for r in rows:
        groups.setdefault(r["group_id"], set()).add(r["messages"][1]["content"])
    assert sorted(map(sorted, groups.values())) == [["What is 17*23?"], ["What is 2+3?"]]  # one question each
    cut = [r for r in rows if r.get("final_observation")]
    assert [r["final_observation"] for r in cut] == ["tool: 374"] and cut[0]["done"] is not None
    assert ("id" in rows[0]) == (release == "0.1.5") and ("example_id" in rows[0]) == (release != "0.1.5")


def test_what_follows_the_last_turn_is_kept_through_advantages_and_shown(tmp_path):
    """The fourth rollout ends with a tool result after its last assistant turn: it is the
    last step's final_observation, carried by `gaca advantages` and shown by `inspect --traj`."""
    last = records()[3]
    roles = [m["role"] for m in last["completion"]]
    tail = last["completion"][len(roles) - roles[::-1].index("assistant") :]
    assert tail and tail[0]["role"] == "tool"
    rows = by_traj(read(RESULTS))[f"{RESULTS}:4"]
    assert rows[-1]["final_observation"] == "\n".join(f"{m['role']}: {m['content']}" for m in tail)
    assert all("final_observation" not in r for r in rows[:-1])
    log, out = tmp_path / "log.parquet", tmp_path / "adv.parquet"
    import_json("verifiers", RESULTS, out=log)
    res = gaca("advantages", log, "-o", out, "--method", "grpo")
    assert res.exit_code == 0, res.output
    kept = pq.read_table(out).to_pylist()
    assert [r["final_observation"] for r in kept if r["traj_id"] == f"{RESULTS}:4"][-1] == rows[-1]["final_observation"]
    res = gaca("inspect", out, "--traj", f"{RESULTS}:4")
    assert res.exit_code == 0, res.output
    assert "after the last step: tool:" in " ".join(res.stdout.split())


# --- real runs: vf-eval outputs committed in the verifiers repository (MIT) -----------------
# Not in this repository: read from the project's shared folder beside the checkout when it
# holds them (tests/data/verifiers/README.md lists them with their sha256).

REAL = Path(__file__).parents[3] / "shared" / "data" / "verifiers" / "real"
REAL_RUNS = ["wordle/b5161fc3", "math_python/25f52552", "arc_agi_3/8bf05aed"]
needs_real_runs = pytest.mark.skipif(not REAL.is_dir(), reason=f"the real vf-eval runs are not in {REAL}")


@needs_real_runs
def test_real_runs_are_the_upstream_files_with_their_license():
    assert "MIT License" in (REAL / "LICENSE").read_text("utf-8")
    readme = (Path(__file__).parents[1] / "data" / "verifiers" / "README.md").read_text("utf-8")
    files = sorted(p for p in REAL.glob("*/*/*") if p.is_file())
    assert [str(p.parent.relative_to(REAL)) for p in files[::2]] == sorted(REAL_RUNS)
    assert [p.name for p in files] == ["metadata.json", "results.jsonl"] * len(REAL_RUNS)
    for path in [*files, REAL / "LICENSE"]:  # each file whole, as upstream: its sha256 is in the README
        name = path.relative_to(REAL).as_posix()
        assert f"| `{name}`" in readme and hashlib.sha256(path.read_bytes()).hexdigest() in readme, name


@needs_real_runs
@pytest.mark.parametrize("run", REAL_RUNS)
def test_real_vf_eval_run_imports_with_its_groups_rewards_and_final_feedback(tmp_path, run):
    """A real run of the 0.1 era (rollouts keyed `id`, rubric scores as top-level keys, `env` in
    metadata.json), imported by the CLI from its folder: one step per assistant turn, the file's
    reward on the last, one group per example (its prompt, answer and info), and whatever
    follows the last turn (a word game's closing feedback) kept as final_observation."""
    folder = REAL / run
    results = folder / "results.jsonl"
    source = [json.loads(line) for line in results.read_text("utf-8").splitlines()]
    metadata = json.loads((folder / "metadata.json").read_text("utf-8"))
    out = tmp_path / "log.parquet"
    summary = import_json("verifiers", folder, out=out)
    rows = pq.read_table(out).to_pylist()
    turns = [[i for i, m in enumerate(rec["completion"]) if m["role"] == "assistant"] for rec in source]
    assert len(source) == metadata["num_examples"] * metadata["rollouts_per_example"]
    assert (summary["rows"], summary["trajectories"], summary["groups"]) == (
        sum(map(len, turns)),
        len(source),
        metadata["num_examples"],
    )
    trajs = by_traj(rows)
    group_of: dict[str, list[int]] = {}
    for n, (rec, at) in enumerate(zip(source, turns, strict=True), start=1):
        steps = sorted(trajs[f"{results}:{n}"], key=lambda s: s["step_idx"])
        assert [s["step_idx"] for s in steps] == list(range(len(at)))
        assert [s["reward"] for s in steps] == [0.0] * (len(at) - 1) + [rec["reward"]]
        assert [s["done"] for s in steps] == [False] * (len(at) - 1) + [True]
        scores = {k: v for k, v in rec.items() if isinstance(v, float) and k != "reward"}  # rubric, timings
        for s in steps:
            assert (s["episode_reward"], s["id"], s["task"]) == (rec["reward"], rec["id"], rec["task"])
            assert (s["env_id"], s["model"]) == (metadata["env"], metadata["model"])
            assert {k: s[k] for k in scores} == scores
        tools = any(m.get("tool_calls") for m in rec["completion"])
        for s, i in zip(steps, at, strict=True):
            chat = rec["prompt"] + rec["completion"][:i]  # the context of a turn: the chat before it
            assert len(s["messages"]) == len(chat)
            assert s["messages"][-1] == {"role": chat[-1]["role"], "content": chat[-1]["content"]}
            if not tools:  # a text chat is kept as it is
                assert (s["messages"], s["action"]) == (chat, rec["completion"][i]["content"])
        tail = rec["completion"][at[-1] + 1 :]
        assert steps[-1].get("final_observation") == (
            "\n".join(f"{m['role']}: {m['content']}" for m in tail) if tail else None
        )
        group_of.setdefault(steps[0]["group_id"], []).append(n - 1)
    example = lambda i: json.dumps([source[i][k] for k in ("prompt", "answer", "info") if k in source[i]])  # noqa: E731
    assert all(len({example(i) for i in group}) == 1 for group in group_of.values())
    assert sorted(map(len, group_of.values())) == [metadata["rollouts_per_example"]] * metadata["num_examples"]
    res = gaca("validate", out, "--for", "score")
    assert res.exit_code == 0, res.output


@needs_real_runs
def test_real_wordle_run_groups_by_secret_word_not_by_id_and_keeps_the_games_last_feedback(tmp_path):
    """In the 0.1 layout `id` is i // rollouts_per_example over rollout-major results: in this
    wordle run `id` 0 holds three different secret words, all asked with the same prompt."""
    folder = REAL / "wordle" / "b5161fc3"
    source = [json.loads(line) for line in (folder / "results.jsonl").read_text("utf-8").splitlines()]
    assert len({json.dumps(rec["prompt"]) for rec in source}) == 1
    assert sorted(rec["answer"] for rec in source if rec["id"] == 0) == ["story", "thing", "water"]
    out = tmp_path / "log.parquet"
    import_json("verifiers", folder, out=out)
    rows = pq.read_table(out).to_pylist()
    words: dict[str, set[str]] = {}
    for r in rows:
        words.setdefault(r["group_id"], set()).add(r["answer"])
    assert sorted(map(sorted, words.values())) == [["sleep"], ["story"], ["thing"], ["voice"], ["water"]]
    last = [r for r in rows if r["done"]]
    assert len(last) == 15 and all(r["final_observation"].startswith("user: ") for r in last)
    assert last[0]["final_observation"] == "user: \nS H I R T\nG X X G Y\nYou have 4 guesses left.\n[GAME] [story]"
