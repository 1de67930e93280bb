"""Re-record the SkyRL fixtures of this folder with SkyRL's own code (see README.md).

Needs Python 3.12 and skyrl 0.4.0 in a separate virtual environment (never the project's);
requirements-fixture.txt (next to this script) is that environment's `pip freeze`:

    python3.12 -m venv /tmp/fw/skyrl312
    /tmp/fw/skyrl312/bin/pip install --no-deps -r tests/data/skyrl/requirements-fixture.txt
    PYTHONPATH=. /tmp/fw/skyrl312/bin/python tests/data/skyrl/make_fixture.py

Token ids come from the tiny tokenizer of tests/lm/tiny_models.py (trained here, no model hub);
SkyRL decodes them itself. No model is run: the responses, rewards and log-probs are chosen here.

- `dumped_evals/<step>_evals/*.jsonl`: written by SkyRL's `dump_per_dataset_eval_results`
  (skyrl/train/utils/trainer_utils.py), with the inputs and metrics `evaluate`
  (skyrl/train/evaluate.py) gives it: `prepare_generator_input`, `validate_generator_output`,
  `concatenate_generator_outputs`, `calculate_per_dataset_metrics`,
  `get_metrics_from_generator_output`, all SkyRL's.
- `generator_*.jsonl`: a `GeneratorOutput` with SkyRL's `TrajectoryID`s and uids from
  `prepare_generator_input`, checked by SkyRL's `validate_generator_output`, written by gaca's
  `write_generator_output` (SkyRL has no writer for it; users call this one in their trainer).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from skyrl.train.generators.utils import (
    concatenate_generator_outputs,
    get_metrics_from_generator_output,
    prepare_generator_input,
)
from skyrl.train.utils.trainer_utils import (
    calculate_per_dataset_metrics,
    dump_per_dataset_eval_results,
    validate_generator_output,
)

from gaca_cli.integrations.imports.skyrl import write_generator_output
from tests.lm.tiny_models import build_tokenizer

HERE = Path(__file__).parent
TOK = build_tokenizer()
EOS = TOK.eos_token_id
SYSTEM = "You are an agent in a house. Task: reach the garden"


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def prompt_ids(chat: list[dict[str, str]]) -> list[int]:
    return ids(TOK.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))


def chat(observation: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": observation}]


def dataset_row(uid: str, observation: str, data_source: str | None, env_class: str) -> dict[str, Any]:
    """A row as PromptDataset yields it: prompt, env_class, env_extras (the other columns), uid."""
    extras: dict[str, Any] = {"reward_spec": {"ground_truth": "garden"}}
    if data_source is not None:
        extras["data_source"] = data_source
    return {"prompt": chat(observation), "env_class": env_class, "env_extras": extras, "uid": uid}


def eval_dump(folder: str, global_step: int | None, prompts: list[dict], answers: list[tuple], per_token: bool):
    """What `evaluate` does with one batch of eval prompts, 2 samples each, not step-wise."""
    n = 2
    gen_input, uids = prepare_generator_input(prompts, n, {"temperature": 0.0}, "gsm8k", "eval", global_step)
    out: dict[str, Any] = {k: [] for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks")}
    out["stop_reasons"] = []
    out["rollout_logprobs"] = None
    for chat_, (text, reward, stop) in zip(gen_input["prompts"], answers):
        response = ids(text) + ([EOS] if stop == "stop" else [])
        out["prompt_token_ids"].append(prompt_ids(chat_))
        out["response_ids"].append(response)
        out["loss_masks"].append([1] * len(response))
        out["stop_reasons"].append(stop)
        out["rewards"].append([0.0] * (len(response) - 1) + [reward] if per_token else reward)
    out["rollout_metrics"] = {"generate/avg_num_tokens": sum(map(len, out["response_ids"])) / len(answers)}
    validate_generator_output(len(gen_input["prompts"]), out)
    concat = concatenate_generator_outputs([out])
    data_sources = [extras.get("data_source") for extras in gen_input["env_extras"]]
    metrics = calculate_per_dataset_metrics(concat, uids, data_sources, n)
    overall = get_metrics_from_generator_output(concat, uids)
    metrics.update(
        {
            "eval/all/avg_score": overall["avg_score"],
            f"eval/all/pass_at_{n}": overall["pass_at_n"],
            "eval/all/mean_positive_reward": overall["mean_positive_reward"],
        }
    )
    for key, value in concat["rollout_metrics"].items():
        metrics[f"eval/all/{key}"] = value
    path = HERE / "dumped_evals" / folder
    path.mkdir(parents=True)
    dump_per_dataset_eval_results(
        path, TOK, concat, data_sources, list(gen_input["env_classes"]), list(gen_input["env_extras"]), metrics
    )


def eval_dumps() -> None:
    shutil.rmtree(HERE / "dumped_evals", ignore_errors=True)
    hall = "You are in the hall. A brass key lies on the table. Your hands are empty."
    corridor = "You are in the corridor. The garden door is locked. You carry a brass key."
    # global step 3: two data sources, per-token rewards (the reward on the last token)
    eval_dump(
        "global_step_3_evals",
        3,
        [
            dataset_row("e0", hall, "house/garden", "house"),
            dataset_row("e1", corridor, "house/garden", "house"),
            dataset_row("e2", hall, None, "house"),  # no data source: SkyRL files it as "unknown"
        ],
        [
            ("take key", 1.0, "stop"),
            ("go to kitchen", 0.0, "stop"),
            ("open door with key", 1.0, "stop"),
            ("open door with key", 1.0, "stop"),
            ("look around", 0.0, "stop"),
            ("go to corridor go to", 0.0, "length"),
        ],
        per_token=True,
    )
    # eval-only run (global_step None): one data source, one reward per rollout
    eval_dump(
        "eval_only",
        None,
        [dataset_row("e0", hall, "house/garden", "house")],
        [("take key", 1.0, "stop"), ("go to hall", 0.0, "stop")],
        per_token=False,
    )


def turn(output: str, observation: str | None, logprobs: list[float], added_eos: bool):
    """One step-wise row's response, loss mask and log-probs, as SkyRLGymGenerator builds them:
    output tokens (mask 1; a synthetic EOS gets 0) then observation tokens (mask 0, log-prob 0.0)."""
    out_ids = ids(output) + [EOS]
    obs_ids = [] if observation is None else ids(f"<|user|>{observation}\n<|assistant|>")
    mask = [1] * len(out_ids)
    if added_eos:
        mask[-1] = 0
    lps = [logprobs[i % len(logprobs)] for i in range(len(out_ids))]
    if added_eos:
        lps[-1] = 0.0
    return out_ids, out_ids + obs_ids, mask + [0] * len(obs_ids), lps + [0.0] * len(obs_ids)


def stepwise() -> None:
    """global step 3, two prompts x two samples, step-wise: one row per turn; the turn's reward
    at its last output token, `is_last_step` on each trajectory's last row."""
    prompts = [
        dataset_row("q0", "You are in the hall. A brass key lies on the table. Your hands are empty.", None, "house"),
        dataset_row("q1", "You are in the corridor. The garden door is locked. You carry a brass key.", None, "house"),
    ]
    gen_input, uids = prepare_generator_input(prompts, 2, {"temperature": 1.0}, "house", "train", 3)
    corridor = "You are in the corridor. The garden door is locked. You carry a brass key."
    turns_of = {  # (output, observation, log-probs, synthetic EOS, the turn's reward)
        ("q0", 0): [
            ("take key", "You carry a brass key.", [-0.5, -0.25], False, 0.0),
            ("go to corridor", None, [-1.0], False, 1.0),
        ],
        ("q0", 1): [("look around", None, [-0.75, -0.5], False, 0.0)],
        ("q1", 0): [
            ("examine", "The door is locked.", [-0.1], False, 0.0),
            ("open door with key", corridor, [-0.2, -0.3], True, 0.5),
            ("go to garden", None, [-0.3], False, 1.0),
        ],
        ("q1", 1): [
            ("go to hall", "You are in the hall.", [-0.4, -0.6], False, 0.0),
            ("north", None, [-0.9], False, 0.0),
        ],
    }
    out: dict[str, Any] = {k: [] for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks")}
    out.update(stop_reasons=[], rollout_logprobs=[], trajectory_ids=[], is_last_step=[], env_metrics=[])
    for tid, chat_ in zip(gen_input["trajectory_ids"], gen_input["prompts"]):
        turns = turns_of[(tid.instance_id, tid.repetition_id)]
        context = prompt_ids(chat_)
        for j, (output, observation, logprobs, added_eos, reward) in enumerate(turns):
            out_ids, response, mask, lps = turn(output, observation, logprobs, added_eos)
            rewards = [0.0] * len(response)
            rewards[len(out_ids) - 1] = reward
            last = j == len(turns) - 1
            out["prompt_token_ids"].append(list(context))
            out["response_ids"].append(response)
            out["rewards"].append(rewards)
            out["loss_masks"].append(mask)
            out["stop_reasons"].append("stop")
            out["rollout_logprobs"].append(lps)
            out["trajectory_ids"].append(tid)
            out["is_last_step"].append(last)
            out["env_metrics"].append({"turns": len(turns)} if last else {})
            context = context + response
    out["rollout_metrics"] = {"generate/avg_num_tokens": sum(map(len, out["response_ids"])) / len(uids)}
    validate_generator_output(len(gen_input["prompts"]), out, step_wise=True)
    path = HERE / "generator_stepwise.jsonl"
    path.unlink(missing_ok=True)
    write_generator_output(path, out, [t.instance_id for t in out["trajectory_ids"]], global_step=3)


def batch() -> None:
    """global step 7, one prompt x two samples, not step-wise: one row per trajectory; the first
    has two turns with an observation between them; the second was truncated (overlong filtering
    zeroed its loss mask); one reward per row; no log-probs, no trajectory ids."""
    gen_input, uids = prepare_generator_input(
        [dataset_row("p7", "You are in the hall. Your hands are empty.", None, "house")], 2, {}, "house", "train", 7
    )
    obs = ids("<|user|>You carry a brass key.\n<|assistant|>")
    first = ids("take key") + [EOS] + obs + ids("go to corridor") + [EOS]
    first_mask = [1] * (len(ids("take key")) + 1) + [0] * len(obs) + [1] * (len(ids("go to corridor")) + 1)
    second = ids("go to corridor go to")
    out = {
        "prompt_token_ids": [prompt_ids(c) for c in gen_input["prompts"]],
        "response_ids": [first, second],
        "rewards": [1.0, 0.0],
        "loss_masks": [first_mask, [0] * len(second)],
        "stop_reasons": ["stop", "length"],
        "rollout_logprobs": None,
        "trajectory_ids": None,
        "is_last_step": None,
        "env_metrics": [{"tool_calls": 1}, {}],
        "trajectory_generation_times": [1.5, 2.25],
    }
    validate_generator_output(len(gen_input["prompts"]), out)
    path = HERE / "generator_batch.jsonl"
    path.unlink(missing_ok=True)
    write_generator_output(path, out, uids, global_step=7)


if __name__ == "__main__":
    if sys.version_info < (3, 12):
        sys.exit("skyrl 0.4.0 needs Python >= 3.12: run this with the venv named in the docstring")
    eval_dumps()
    stepwise()
    batch()
