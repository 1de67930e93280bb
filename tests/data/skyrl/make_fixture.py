"""Re-record the SkyRL fixtures of this folder (see README.md): `python tests/data/skyrl/make_fixture.py`.

SkyRL 0.4.0 needs Python >= 3.12 and a CUDA-era dependency set that does not install on the
project's machines, so its generator cannot be run here. The generator output below is laid out
exactly as `SkyRLGymGenerator.generate` (skyrl/train/generators/skyrl_gym_generator.py) lays it
out, and is written with gaca's `write_generator_output`, the function users call in their
trainer. The eval dump lines have the fields, in the order, that `dump_per_dataset_eval_results`
(skyrl/train/utils/trainer_utils.py) writes, with `json.dumps(entry, ensure_ascii=False)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gaca_cli.integrations.imports.skyrl import write_generator_output

HERE = Path(__file__).parent


@dataclass
class TrajectoryID:  # the fields of skyrl.train.generators.base.TrajectoryID
    instance_id: str
    repetition_id: int


def turn(output_ids, obs_ids, logprobs, added_eos=False):
    """One step-wise row's response, loss mask and log-probs, as TurnOutput builds them:
    output tokens (mask 1, the synthetic EOS 0) then observation tokens (mask 0, log-prob 0.0)."""
    mask = [1] * len(output_ids) if not added_eos else [1] * (len(output_ids) - 1) + [0]
    return output_ids + obs_ids, mask + [0] * len(obs_ids), logprobs + [0.0] * len(obs_ids)


def stepwise() -> None:
    """global step 3, two prompts x two samples, step-wise: one row per turn; the turn's reward
    at its last output token (per-token rewards), `is_last_step` on each trajectory's last row."""
    system = [151644, 8948, 198]
    trajectories = [
        (
            "q0",
            0,
            [([11, 12, 13], [90, 91], [-0.5, -0.25, -0.125], False, 0.0), ([14, 15], [], [-1.0, -2.0], False, 1.0)],
        ),
        ("q0", 1, [([21, 22], [], [-0.75, -0.5], False, 0.0)]),
        (
            "q1",
            0,
            [
                ([31], [92, 93], [-0.1], False, 0.0),
                ([32, 151645], [94], [-0.2, 0.0], True, 0.5),
                ([33], [], [-0.3], False, 1.0),
            ],
        ),
        ("q1", 1, [([41, 42], [95], [-0.4, -0.6], False, 0.0), ([43], [], [-0.9], False, 0.0)]),
    ]
    out: dict[str, list] = {k: [] for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks")}
    out.update(stop_reasons=[], rollout_logprobs=[], trajectory_ids=[], is_last_step=[], env_metrics=[])
    for instance, rep, turns in trajectories:
        context = system + [1000 + int(instance[1:])]
        for j, (output_ids, obs_ids, logprobs, added_eos, step_reward) in enumerate(turns):
            response, mask, lps = turn(output_ids, obs_ids, logprobs, added_eos)
            rewards = [0.0] * len(response)
            rewards[len(output_ids) - 1] = step_reward
            last = j == len(turns) - 1
            out["prompt_token_ids"].append(list(context))
            out["response_ids"].append(response)
            out["rewards"].append(rewards)
            out["loss_masks"].append(mask)
            out["stop_reasons"].append("stop")
            out["rollout_logprobs"].append(lps)
            out["trajectory_ids"].append(TrajectoryID(instance, rep))
            out["is_last_step"].append(last)
            out["env_metrics"].append({"turns": len(turns)} if last else {})
            context = context + response
    out["rollout_metrics"] = {"generate/avg_num_tokens": 3.5}
    uids = [t.instance_id for t in out["trajectory_ids"]]
    path = HERE / "generator_stepwise.jsonl"
    path.unlink(missing_ok=True)
    write_generator_output(path, out, uids, global_step=3)


def batch() -> None:
    """global step 7, one prompt x two samples, not step-wise: one row per trajectory; the first
    has two turns with an observation between them and per-token rewards; the second was
    truncated (overlong filtering zeroed its loss mask) and has a scalar reward; no log-probs."""
    out = {
        "prompt_token_ids": [[151644, 2000], [151644, 2000]],
        "response_ids": [[51, 52, 53, 96, 97, 54, 55], [61, 62, 63]],
        "rewards": [[0.0, 0.0, 0.25, 0.0, 0.0, 0.0, 1.0], 0.0],
        "loss_masks": [[1, 1, 1, 0, 0, 1, 1], [0, 0, 0]],
        "stop_reasons": ["stop", "length"],
        "rollout_logprobs": None,
        "trajectory_ids": None,
        "is_last_step": None,
        "env_metrics": [{"tool_calls": 1}, {}],
        "trajectory_generation_times": [1.5, 2.25],
    }
    path = HERE / "generator_batch.jsonl"
    path.unlink(missing_ok=True)
    write_generator_output(path, out, ["p7", "p7"], global_step=7)


def eval_dump() -> None:
    """`<export_path>/dumped_evals/global_step_3_evals/`: one data source, two prompts x two samples."""
    folder = HERE / "dumped_evals" / "global_step_3_evals"
    folder.mkdir(parents=True, exist_ok=True)
    q = "<|im_start|>user\nWhat is {}?<|im_end|>\n<|im_start|>assistant\n"
    rows = [
        (q.format("2+3"), "2+3 = 5. #### 5<|im_end|>", 1.0, "stop", {"reward_spec": {"ground_truth": "5"}}),
        (q.format("2+3"), "2+3 = 6. #### 6<|im_end|>", 0.0, "stop", {"reward_spec": {"ground_truth": "5"}}),
        (q.format("7*6"), "7*6 = 42<|im_end|>", [0.0, 0.0, 0.5, 0.5], "stop", {"reward_spec": {"ground_truth": "42"}}),
        (q.format("7*6"), "Let me think step by", 0.0, "length", {"reward_spec": {"ground_truth": "42"}}),
    ]
    with open(folder / "openai_gsm8k.jsonl", "w") as f:
        for prompt, response, score, stop, extras in rows:
            entry = {
                "input_prompt": prompt,
                "output_response": response,
                "score": score,
                "stop_reason": stop,
                "env_class": "gsm8k",
                "env_extras": {"data_source": "openai/gsm8k", **extras},
                "data_source": "openai/gsm8k",
            }
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    metrics = {"eval/openai_gsm8k/avg_score": 0.5, "eval/openai_gsm8k/pass_at_2": 1.0, "eval/all/avg_score": 0.5}
    with open(folder / "aggregated_results.jsonl", "w") as f:
        f.write(json.dumps(metrics, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    stepwise()
    batch()
    eval_dump()
