"""Re-record the SkyRL fixtures of this folder with SkyRL's own code (see README.md).

Needs Python 3.12 and skyrl 0.4.0 in a separate virtual environment (never the project's);
requirements-fixture.txt (next to this script) is that environment's `pip freeze`:

    python3.12 -m venv /tmp/fw/skyrl312
    /tmp/fw/skyrl312/bin/pip install --no-deps -r tests/data/skyrl/requirements-fixture.txt
    PYTHONPATH=. /tmp/fw/skyrl312/bin/python tests/data/skyrl/make_fixture.py

Token ids come from the tiny tokenizer of tests/lm/tiny_models.py (trained here, no model hub);
SkyRL decodes them itself. No model is run: the responses, rewards and log-probs are chosen here.

- `dumped_evals/*/*.jsonl`: written by SkyRL's own `evaluate` (skyrl/train/evaluate.py), run
  end to end on a default `SkyRLTrainConfig` with `dump_eval_results`, the eval set read by
  SkyRL's `PromptDataset` and `build_dataloader`; `evaluate` calls `dump_per_dataset_eval_results`
  (skyrl/train/utils/trainer_utils.py). Only the generator is not SkyRL's: `CannedGenerator`
  stands in for `SkyRLGymGenerator` and its vLLM engine (which need a GPU).
- `generator_*.jsonl`: a `GeneratorOutput` with SkyRL's `TrajectoryID`s and uids from
  `prepare_generator_input`, checked by SkyRL's `validate_generator_output`, written by gaca's
  `write_generator_output` (SkyRL has no writer for it; users call this one in their trainer).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.dataset import PromptDataset
from skyrl.train.evaluate import evaluate
from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput
from skyrl.train.generators.utils import prepare_generator_input
from skyrl.train.utils.trainer_utils import build_dataloader, validate_generator_output

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


Turn = tuple[str, "str | None", float]  # the policy's output, the observation after it (or None), reward


class CannedGenerator(GeneratorInterface):
    """Stands in for SkyRLGymGenerator and its inference engine: answers each trajectory
    (instance_id, repetition_id) with the turns given, laid out as SkyRLGymGenerator lays out its
    output: response = output tokens + EOS (unless cut off) + observation tokens, loss mask 1 on
    the output tokens and EOS; per-token rewards put a turn's reward on its last output token."""

    def __init__(self, turns: dict[tuple[str, int], list[Turn]], per_token: bool, step_wise: bool):
        self.turns, self.per_token, self.step_wise = turns, per_token, step_wise

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        out: dict[str, Any] = {k: [] for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks")}
        out.update(stop_reasons=[], trajectory_ids=[], is_last_step=[])
        for tid, chat_ in zip(input_batch["trajectory_ids"], input_batch["prompts"]):
            turns = self.turns[(tid.instance_id, tid.repetition_id)]
            context = prompt_ids(chat_)
            response: list[int] = []
            mask: list[int] = []
            rewards: list[float] = []
            for j, (output, observation, reward) in enumerate(turns):
                cut = output.endswith(" go to")  # the fixture's way to say: max_generate_length reached
                out_ids = ids(output) + ([] if cut else [EOS])
                obs_ids = [] if observation is None else ids(f"<|user|>{observation}\n<|assistant|>")
                response += out_ids + obs_ids
                mask += [1] * len(out_ids) + [0] * len(obs_ids)
                rewards += [0.0] * (len(out_ids) - 1) + [reward] + [0.0] * len(obs_ids)
                last = j == len(turns) - 1
                if self.step_wise or last:
                    out["prompt_token_ids"].append(list(context))
                    out["response_ids"].append(response)
                    out["loss_masks"].append(mask)
                    out["rewards"].append(rewards if self.per_token else sum(rewards))
                    out["stop_reasons"].append("length" if cut else "stop")
                    out["trajectory_ids"].append(tid)
                    out["is_last_step"].append(last)
                    if self.step_wise:
                        context = context + response
                        response, mask, rewards = [], [], []
        out["rollout_logprobs"] = None
        if not self.step_wise:
            out["trajectory_ids"] = out["is_last_step"] = None
        out["rollout_metrics"] = {}
        return out  # type: ignore[return-value]


def run_evaluate(
    folder: Path, global_step: int | None, rows: list[dict], turns: dict, per_token: bool, step_wise: bool
):
    """SkyRL's `evaluate` over `rows` (an eval dataset file read by SkyRL's PromptDataset and
    dataloader), 2 samples per prompt, dumping into `folder/dumped_evals/`."""
    data = folder / f"eval_{global_step}_{step_wise}.jsonl"
    with open(data, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    cfg = SkyRLTrainConfig()
    cfg.trainer.export_path = str(folder)
    cfg.trainer.eval_batch_size = len(rows)
    cfg.trainer.dump_eval_results = True
    if hasattr(cfg.data, "dataloader"):
        cfg.data.dataloader.num_workers = 0
    else:  # skyrl 0.1, 0.2 (make_fixture_versions.py): no worker processes only with the HTTP endpoint on
        cfg.generator.inference_engine.enable_http_endpoint = True
    cfg.generator.eval_n_samples_per_prompt = 2
    cfg.generator.step_wise_trajectories = step_wise
    cfg.environment.env_class = "house"
    dataset = PromptDataset(str(data), TOK, max_prompt_length=512, num_workers=1)
    loader = build_dataloader(cfg, dataset, is_train=False)
    generator = CannedGenerator(turns, per_token, step_wise)
    return asyncio.run(evaluate(loader, generator, cfg, global_step, TOK))


def eval_dumps() -> None:
    shutil.rmtree(HERE / "dumped_evals", ignore_errors=True)
    hall = "You are in the hall. A brass key lies on the table. Your hands are empty."
    corridor = "You are in the corridor. The garden door is locked. You carry a brass key."
    extras = {"reward_spec": {"ground_truth": "garden"}}
    garden = [
        {"prompt": chat(hall), "env_class": "house", "data_source": "house/garden", **extras},
        {"prompt": chat(corridor), "env_class": "house", "data_source": "house/garden", **extras},
        {"prompt": chat(hall), "env_class": "house", "data_source": None, **extras},  # filed as "unknown"
    ]
    with tempfile.TemporaryDirectory() as tmp:
        # global step 3: per-token rewards, one row per rollout
        run_evaluate(
            Path(tmp),
            3,
            garden,
            {
                ("0", 0): [("take key", None, 1.0)],
                ("0", 1): [("go to kitchen", None, 0.0)],
                ("1", 0): [("open door with key", None, 1.0)],
                ("1", 1): [("open door with key", None, 1.0)],
                ("2", 0): [("look around", None, 0.0)],
                ("2", 1): [("go to corridor go to", None, 0.0)],
            },
            per_token=True,
            step_wise=False,
        )
        # global step 5, step-wise: one dump line per turn
        run_evaluate(
            Path(tmp),
            5,
            garden[:1],
            {
                ("0", 0): [("take key", "You carry a brass key.", 0.0), ("go to corridor", None, 1.0)],
                ("0", 1): [("look around", None, 0.0)],
            },
            per_token=True,
            step_wise=True,
        )
        # an eval-only run (global_step None): one reward per rollout
        run_evaluate(
            Path(tmp),
            None,
            garden[:1],
            {("0", 0): [("take key", None, 1.0)], ("0", 1): [("go to hall", None, 0.0)]},
            per_token=False,
            step_wise=False,
        )
        shutil.copytree(Path(tmp) / "dumped_evals", HERE / "dumped_evals")


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
    eval_dumps()
    stepwise()
    batch()
