"""Write the `gaca import --from rllm` fixtures of every rLLM release line, each by that line's
own saving code (tests/data/rllm/versions/<line>/).

rLLM is not on the package index, so its source is read from a git clone of rllm-org/rllm
(the first argument, default /work/.mirror/rllm-org+rllm/repo): for each line, the files that
hold its saving code are taken unmodified from the release's commit (`git show <commit>:<path>`)
into a temporary `rllm/` package whose `__init__.py` files are empty, so that nothing else of
rLLM (and none of its heavy dependencies) is imported. Two things are taken out of larger
modules with `ast`, as they are in the source: the `TerminationReason` enum of
`rllm/workflows/workflow.py`, and, for 0.1, `save_trajectories` of `rllm/utils.py`.

    /work/venvs/rllm/bin/python tests/data/rllm/make_fixture_versions.py [RLLM_GIT_DIR]

(a venv with torch==2.13.0 and pydantic 2.14.4: rLLM does not pin pydantic).
Each line's folder gets `PROVENANCE`: the tag, the commit, and the sha256 of each file used.

What each line saves, as its own code writes it:

- 0.1 (`save_trajectories`, the only saving code of that release): `trajectories.pt`, the
  `Trajectory` objects `AgentExecutionEngine.execute_tasks` returns, pickled by `torch.save`;
- 0.2.0 and later: `results.json`, `json.dump([episode.to_dict() for episode in results], f,
  indent=4)`, as rLLM's examples save a run (examples/solver_judge/run_solver_judge_flow.py);
- 0.2.1 and later: `episodes/train_step_3_epoch_0/`, written by
  `EpisodeLogger(base).log_episodes_batch(episodes, step=3, mode="train", epoch=0)`, what the
  trainer runs with `trainer.log_episodes=true`.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TERMINATION = "rllm/workflows/workflow.py"
COMMON = [
    "rllm/agents/agent.py",
    "rllm/engine/rollout/rollout_engine.py",
    "rllm/tools/tool_base.py",
    "rllm/tools/utils.py",
]
#: label -> (tag, commit, the files taken whole); the TerminationReason enum is taken from
#: TERMINATION in every line but 0.1, which has neither the enum nor Episode
LINES = {
    # the v0.1 release: "Merge pull request #43 from agentica-project/v0.1" (2025-07-12), untagged
    "v0.1": (None, "6a7ac11975bfc223f2aade80f386ac3702621b0f", ["rllm/agents/agent.py"]),
    "v0.2.0": ("v0.2.0", "52efedcb02dab26650360c88045a71fb4c83e04d", COMMON),
    # v0.2.1.post1 (618fa7d4) holds the same files, byte for byte (checked below)
    "v0.2.1": ("v0.2.1", "960d573e4d49cbabf846fa18448120e6863ebfdf", [*COMMON, "rllm/utils/episode_logger.py"]),
    "v0.3.0-pre": (
        "v0.3.0-pre",
        "09567646bfeacfa022c64aa8f97135d7f1e3f824",
        [*COMMON, "rllm/types.py", "rllm/utils/episode_logger.py"],
    ),
    # main on 2026-08-15: the classes moved to rllm/types.py; Episode.session_id, the logger's metadata
    "main-9beb6e0": (
        None,
        "9beb6e0f676a46d38858991fd79ac5f8e0b16d4c",
        [*COMMON, "rllm/types.py", "rllm/utils/episode_logger.py"],
    ),
}
SAME_AS = {"v0.2.1": ("v0.2.1.post1", "618fa7d43833cc778f022dbef1938a706b558fcc")}


def git_show(repo: Path, commit: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout


def excerpt(source: bytes, name: str, header: str) -> bytes:
    """The top-level definition `name` of a module, as it is in the source, after `header`."""
    text = source.decode()
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    return (header + ast.get_source_segment(text, node) + "\n").encode()


def checkout(repo: Path, label: str, root: Path) -> dict[str, str]:
    """The line's files under root/rllm (empty package `__init__`s); {path: sha256 of the source}."""
    _, commit, files = LINES[label]
    hashes = {}
    for path in files:
        data = git_show(repo, commit, path)
        hashes[path] = hashlib.sha256(data).hexdigest()
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    if label == "v0.1":
        source = git_show(repo, commit, "rllm/utils.py")
        (root / "rllm/utils.py").write_bytes(excerpt(source, "save_trajectories", "import os\n\nimport torch\n\n\n"))
        hashes["rllm/utils.py (save_trajectories)"] = hashlib.sha256(source).hexdigest()
    else:
        source = git_show(repo, commit, TERMINATION)
        (root / TERMINATION).parent.mkdir(parents=True, exist_ok=True)
        (root / TERMINATION).write_bytes(excerpt(source, "TerminationReason", "from enum import Enum\n\n\n"))
        hashes[f"{TERMINATION} (TerminationReason)"] = hashlib.sha256(source).hexdigest()
    for folder in {p.parent for p in (root / "rllm").rglob("*.py")}:
        while folder != root:
            (folder / "__init__.py").touch()
            folder = folder.parent
    return hashes


#: the names used, and the modules they are taken from (the last one a line has)
NAMES = {
    "Step": "rllm.agents.agent",
    "Trajectory": "rllm.agents.agent",
    "Episode": "rllm.agents.agent",
    "ModelOutput": "rllm.engine.rollout.rollout_engine",
    "TerminationReason": "rllm.workflows.workflow",
    "EpisodeLogger": "rllm.utils.episode_logger",
    "save_trajectories": "rllm.utils",
}


def load(root: Path) -> dict[str, Any]:
    """The names of NAMES a line has, imported from root (a previous line's modules forgotten)."""
    for name in [m for m in sys.modules if m == "rllm" or m.startswith("rllm.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        found = {}
        for name, module in NAMES.items():
            if (root / (module.replace(".", "/") + ".py")).exists() and hasattr(importlib.import_module(module), name):
                found[name] = getattr(importlib.import_module(module), name)
        return found
    finally:
        sys.path.remove(str(root))


def make(cls: type, **fields: Any) -> Any:
    """An instance of one of the line's classes, given the fields it has (a line's `Step` lacks
    the newer ones: 0.2.0 has no token ids, 0.1 no model_output); `info` is `metadata` in the
    pydantic classes of 0.3."""
    names = set(cls.model_fields) if hasattr(cls, "model_fields") else {f.name for f in dataclasses.fields(cls)}
    if "info" in fields and "info" not in names:
        fields["metadata"] = fields.pop("info")
    return cls(**{key: value for key, value in fields.items() if key in names})


SYSTEM = {"role": "system", "content": "You walk on a frozen lake. Answer with LEFT, RIGHT, UP or DOWN."}
GRIDS = {(0, 0): "S F\nF G\nYou are at S.", (0, 1): "S P\nF G\nYou are at P.", (1, 0): "S F\nP G\nYou are at P."}
MOVES = {"RIGHT": (0, 1), "DOWN": (1, 0), "LEFT": (0, -1), "UP": (-1, 0)}


def step(rllm: dict[str, Any], chat: list[dict], answer: str, base: int, **fields: Any) -> Any:
    """A Step as rLLM's agents build it: the chat so far ending with the answer, and the
    model's output (its token ids and, from 0.2.1, log-probs) as the rollout engine returns it."""
    prompt_ids, response_ids, logprobs = [base, 11, 12], [base + 100, 21], [-0.25, -0.5]
    output = None
    if "ModelOutput" in rllm:
        output = make(
            rllm["ModelOutput"],
            text=answer,
            content=answer,
            reasoning="",
            tool_calls=[],
            prompt_ids=prompt_ids,
            completion_ids=response_ids,
            logprobs=logprobs,
            prompt_length=len(prompt_ids),
            completion_length=len(response_ids),
            finish_reason="stop",
            weight_version=2,
        )
    return make(
        rllm["Step"],
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        logprobs=logprobs,
        chat_completions=[*chat, {"role": "assistant", "content": answer}],
        model_response=answer,
        model_output=output,
        **fields,
    )


def walk(rllm: dict[str, Any], moves: list[str], base: int, goal: bool) -> Any:
    """A FrozenLake trajectory: a step per move, reward 1 on reaching the goal."""
    chat, position, steps = [SYSTEM], (0, 0), []
    for i, move in enumerate(moves):
        observation = GRIDS[position]
        chat = [*chat, {"role": "user", "content": observation}]
        answer = f"<think>go {move.lower()}</think>```{move}```"
        last = i == len(moves) - 1
        steps.append(
            step(
                rllm,
                chat,
                answer,
                base + i,
                observation=observation,
                thought=f"go {move.lower()}",
                action=move,
                info={"timing": {"llm_s": 0.5 + i}},
                reward=1.0 if last and goal else 0.0,
                done=last and goal,
                mc_return=1.0 if goal else 0.0,
                advantage=0.5 if goal else -0.5,
            )
        )
        chat = steps[-1].chat_completions
        dr, dc = MOVES[move]
        position = (min(max(position[0] + dr, 0), 1), min(max(position[1] + dc, 0), 1))
    trajectory = make(rllm["Trajectory"], name="frozenlake_agent", task={"map": "2x2", "seed": 5}, steps=steps)
    trajectory.reward = float(sum(s.reward for s in steps))  # Workflow.compute_trajectory_reward
    if hasattr(trajectory, "info"):
        trajectory.info = {"timing": {"total_s": 2.0}}
    return trajectory


def solver_judge(rllm: dict[str, Any], correct: bool) -> Any:
    """A two-agent episode: a solver's answer and a judge's verdict, one step each."""
    question = {"role": "user", "content": "What is 17 + 25?"}
    answer = "42" if correct else "43"
    verdict = "yes" if correct else "no"
    ask = {"role": "user", "content": f"Is {answer} the sum of 17 and 25? Say yes or no."}
    solver = make(
        rllm["Trajectory"],
        name="solver",
        task={"question": "What is 17 + 25?"},
        steps=[step(rllm, [question], answer, 3000, action=answer, reward=float(correct), done=True)],
    )
    judge = make(rllm["Trajectory"], name="judge", steps=[step(rllm, [ask], verdict, 4000, reward=1.0, done=True)])
    for t in (solver, judge):
        t.reward = float(sum(s.reward for s in t.steps))
    return make(
        rllm["Episode"],
        id=f"math-17:{int(not correct)}",
        task={"question": "What is 17 + 25?", "ground_truth": "42"},
        termination_reason=rllm["TerminationReason"].ENV_DONE,
        is_correct=correct,
        trajectories=[solver, judge],
        metrics={"solver_acc": float(correct), "judge_acc": 1.0},
        session_id=f"session-{int(correct)}",
    )


def episodes(rllm: dict[str, Any]) -> list[Any]:
    out = []
    reasons = rllm["TerminationReason"]
    for rollout, (moves, goal, reason) in enumerate(
        [(["RIGHT", "DOWN"], True, reasons.ENV_DONE), (["UP", "LEFT"], False, reasons.MAX_TURNS_EXCEEDED)]
    ):
        trajectory = walk(rllm, moves, 1000 * (rollout + 1), goal)
        episode = make(
            rllm["Episode"],
            id=f"lake-5:{rollout}",
            task={"map": "2x2", "seed": 5},
            termination_reason=reason,
            is_correct=goal,
            trajectories=[trajectory],
            metrics={"frozenlake_agent_acc": trajectory.reward},
            info={"timing": {"episode_s": 3.0 + rollout}},
        )
        out.append(episode)
    return [*out, solver_judge(rllm, True), solver_judge(rllm, False)]


def write(label: str, rllm: dict[str, Any], target: Path) -> None:
    if label == "v0.1":  # AgentExecutionEngine.execute_tasks returns the Trajectory objects
        results = [walk(rllm, ["RIGHT", "DOWN"], 1000, True), walk(rllm, ["UP", "LEFT"], 2000, False)]
        rllm["save_trajectories"](results, save_dir=str(target), filename="trajectories.pt")
        return
    results = episodes(rllm)
    with open(target / "results.json", "w") as f:  # examples/solver_judge/run_solver_judge_flow.py
        json.dump([episode.to_dict() for episode in results], f, indent=4)
    if "EpisodeLogger" in rllm:
        with tempfile.TemporaryDirectory() as tmp:
            rllm["EpisodeLogger"](tmp).log_episodes_batch(results, step=3, mode="train", epoch=0)
            shutil.copytree(Path(tmp) / "episodes", target / "episodes")


def main() -> None:
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/rllm-org+rllm/repo")
    for label, (tag, commit, files) in LINES.items():
        if tag is not None:
            tagged = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", f"{tag}^{{commit}}"], check=True,
                                    capture_output=True, text=True).stdout.strip()  # fmt: skip
            assert tagged == commit, (tag, tagged, commit)
        if label in SAME_AS:  # the other tag of the line holds the same files
            other = SAME_AS[label][1]
            assert all(git_show(repo, commit, p) == git_show(repo, other, p) for p in [*files, TERMINATION]), label
        target = HERE / "versions" / label
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        with tempfile.TemporaryDirectory() as tmp:
            hashes = checkout(repo, label, Path(tmp))
            write(label, load(Path(tmp)), target)
        lines = [f"repository: rllm-org/rllm\ntag: {tag or '(none)'}\ncommit: {commit}\n"]
        if label in SAME_AS:
            lines.append("the same files, byte for byte, at tag {} (commit {})\n".format(*SAME_AS[label]))
        lines += ["sha256 of the source files used:\n", *(f"  {h}  {p}\n" for p, h in hashes.items())]
        (target / "PROVENANCE").write_text("".join(lines))
        print("written", target)


if __name__ == "__main__":
    main()
