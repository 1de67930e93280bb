"""Re-record the verl fixtures with verl's own dumping code (verl 0.9.1, CPU, no GPU, no Ray cluster).

Run with a Python that has verl (never the project's own venv; see README.md here):

    /tmp/fw/verl/bin/python tests/data/verl/make_fixture.py

The tokenizer is the tiny BPE tokenizer of tests/lm/tiny_models.py (no model hub); the token ids
are made by encoding short texts, so every dumped string decodes back to a known text.

- `rollout/1.jsonl`, `rollout/2.jsonl`: `RayPPOTrainer._log_rollout_data` (the
  `trainer.rollout_data_dir` dump of verl/trainer/ppo/ray_trainer.py), called unbound on a bare
  trainer object that holds only what the method reads (`tokenizer`, `global_steps`, the dump
  executor), with a DataProto shaped like the trainer's batch at that point: 2 prompts x 3
  rollouts, rows reordered as `_balance_batch` reorders them, `token_level_scores` holding the
  score on the last response token, `reward_model.ground_truth`, two reward-extra-info keys
  (`acc`, `pred`) and the agent loop's `request_id`.
- `validation/3.jsonl`: `RayPPOTrainer._dump_generations` with the arguments `_validate` passes
  (its `reward_extra_infos_dict` holds `reward`, a copy of the scores, and `acc`).
- `v1_rollout/4.jsonl`: `PPOTrainer._dump_generations` of verl/trainer/ppo/v1/trainer_base.py
  with the arguments its `_log_rollout_data` builds from TransferQueue (`uid`: the keys
  `{uid}_{session}_{index}`, sorted); session 1 of the first prompt is a multi-output agent
  loop (two outputs, both carrying the session's final score, as `_agent_loop_postprocess`
  copies it).
- `agent_loop/trajectories.jsonl`: verl's `AgentLoopOutput` objects (pydantic), serialised with
  `model_dump(mode="json")` plus the `uid` and `step` the trainer's batch gives (what
  docs/formats/verl.md tells users to write; verl itself keeps these in memory only).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lm"))

from fixture_texts import ANSWERS, PROMPTS, RESPONSES, encode_prompt, pad_rows  # noqa: E402
from tiny_models import build_tokenizer  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402


def rollout_batch(tok, step: int) -> tuple[DataProto, dict]:
    """The trainer's batch after reward: 2 prompts x 3 rollouts, reordered like _balance_batch."""
    prompts, responses, scores, gts, acc, pred, request_ids = [], [], [], [], [], [], []
    for p, (text, answer) in enumerate(zip(PROMPTS, ANSWERS, strict=True)):
        for r, response in enumerate(RESPONSES[p]):
            prompts.append(encode_prompt(tok, text))
            responses.append(tok.encode(response, add_special_tokens=False) + [tok.eos_token_id])
            hit = response == answer
            scores.append(1.0 if hit else (0.0 if step == 1 else -0.5))
            gts.append(answer)
            acc.append(hit)
            pred.append(response)
            request_ids.append(f"req-{step}-{p}-{r}")
    order = [4, 0, 2, 5, 1, 3]  # _balance_batch reorders rows by sequence length
    response_tensor = pad_rows(responses, tok.pad_token_id, left=False)
    token_level_scores = torch.zeros(response_tensor.shape, dtype=torch.float32)
    for i, ids in enumerate(responses):
        token_level_scores[i, len(ids) - 1] = scores[i]
    batch = DataProto.from_dict(
        tensors={
            "prompts": pad_rows(prompts, tok.pad_token_id, left=True),
            "responses": response_tensor,
            "token_level_scores": token_level_scores,
        },
        non_tensors={
            "reward_model": np.array([{"ground_truth": g, "style": "rule"} for g in gts], dtype=object),
            "request_id": np.array(request_ids, dtype=object),
        },
    )
    batch.reorder(torch.tensor(order))
    extra = {"acc": np.array(acc)[order], "pred": np.array(pred, dtype=object)[order]}
    return batch, extra


class _V1Trainer(PPOTrainer):
    """PPOTrainer is abstract (its step hooks); the dumping methods are its own."""

    def on_sample_end(self, *args, **kwargs):
        raise NotImplementedError

    def on_step_end(self, *args, **kwargs):
        raise NotImplementedError


def bare(cls, tok, step: int):
    """A trainer object holding only what the dumping methods read (__init__ is not run)."""
    trainer = cls.__new__(cls)
    trainer.tokenizer = tok
    trainer.global_steps = step
    trainer._init_dump_executor()
    return trainer


def agent_loop_outputs(tok) -> list[dict]:
    """Tool-agent-loop trajectories: assistant turn, tool response, assistant turn."""
    records = []
    cases = [  # (uid, assistant turns, tool responses, tool_rewards, reward_score, with logprobs)
        ("uid-a", ["go to corridor", "open door with key"], ["You are in the corridor."], [0.5], 1.0, True),
        ("uid-a", ["look around", "go to hall"], ["You are in the hall."], [0.0], 0.0, True),
        ("uid-b", ["take key"], [], [], 1.0, False),
        ("uid-b", ["go to kitchen", "go to garden", "go to hall"], ["Kitchen.", "Garden."], [0.25, 0.75], 0.0, False),
    ]
    for n, (uid, turns, tools, tool_rewards, score, with_logprobs) in enumerate(cases):
        prompt_ids = encode_prompt(tok, PROMPTS[0] if uid == "uid-a" else PROMPTS[1])
        response_ids: list[int] = []
        mask: list[int] = []
        for t, turn in enumerate(turns):
            ids = tok.encode(turn, add_special_tokens=False) + [tok.eos_token_id]
            response_ids += ids
            mask += [1] * len(ids)
            if t < len(tools):
                chat = tok.apply_chat_template([{"role": "tool", "content": tools[t]}], tokenize=False)
                ids = tok.encode(chat, add_special_tokens=False)
                response_ids += ids
                mask += [0] * len(ids)
        logprobs = [round(-0.1 * ((i % 7) + 1), 4) if m else 0.0 for i, m in enumerate(mask)] if with_logprobs else None
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=score,
            num_turns=2 * len(turns) + (1 if tools else 0),
            metrics=AgentLoopMetrics(generate_sequences=0.25, tool_calls=0.5 if tools else 0.0),
            extra_fields={
                "turn_scores": [],
                "tool_rewards": tool_rewards,
                "reward_extra_info": {"acc": score > 0},
            },
        )
        records.append({"uid": uid, "step": 5, **output.model_dump(mode="json")})
        if n == 0:
            # round trip through verl's own class: what the importer reads is what verl holds
            assert AgentLoopOutput.model_validate(records[0] | {"uid": None}).response_mask == mask
    return records


def main() -> None:
    tok = build_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        for step in (1, 2):
            trainer = bare(RayPPOTrainer, tok, step)
            batch, extra = rollout_batch(tok, step)
            trainer._log_rollout_data(batch, extra, {}, str(tmp_path / "rollout"))
            trainer._shutdown_dump_executor()

        trainer = bare(RayPPOTrainer, tok, 3)
        batch, extra = rollout_batch(tok, 1)
        inputs = tok.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
        outputs = tok.batch_decode(batch.batch["responses"], skip_special_tokens=True)
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        gts = [item.non_tensor_batch["reward_model"]["ground_truth"] for item in batch]
        trainer._dump_generations(
            inputs=inputs,
            outputs=outputs,
            gts=gts,
            scores=scores,
            reward_extra_infos_dict={"reward": list(scores), "acc": list(extra["acc"].tolist())},
            dump_path=str(tmp_path / "validation"),
        )
        trainer._shutdown_dump_executor()

        trainer = bare(_V1Trainer, tok, 4)
        keys, v1_inputs, v1_outputs, v1_gts, v1_scores = [], [], [], [], []
        for p, (text, answer) in enumerate(zip(PROMPTS, ANSWERS, strict=True)):
            for session in range(2):
                outs = RESPONSES[p][session : session + 2] if (p, session) == (0, 1) else [RESPONSES[p][session]]
                final = 1.0 if outs[-1] == answer else 0.0
                for i, out in enumerate(outs):
                    keys.append(f"prompt{p}-uuid_{session}_{i}")
                    v1_inputs.append(tok.decode(encode_prompt(tok, text), skip_special_tokens=True))
                    v1_outputs.append(out)
                    v1_gts.append(answer)
                    v1_scores.append(final)
        trainer._dump_generations(
            inputs=v1_inputs,
            outputs=v1_outputs,
            gts=v1_gts,
            scores=v1_scores,
            reward_extra_infos_dict={"uid": keys},
            dump_path=str(tmp_path / "v1_rollout"),
        )
        trainer._shutdown_dump_executor()

        for sub in ("rollout", "validation", "v1_rollout"):
            target = HERE / sub
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(tmp_path / sub, target)

    target = HERE / "agent_loop"
    target.mkdir(exist_ok=True)
    with open(target / "trajectories.jsonl", "w", encoding="utf-8") as fh:
        for record in agent_loop_outputs(tok):
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
