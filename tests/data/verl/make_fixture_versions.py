"""Record the verl rollout dumps of `versions/` with each verl release line's own dumping code.

verl writes `gts` (the ground truth) from 0.6 on, and only the reward-extra-info lists the
reward function returned (`acc`, `pred`, ...): a dump may have both, either, or neither. Run
it once per release, each in a virtual environment of its own that has that verl (see
README.md here for the commands; never the project's own venv):

    /tmp/fw/verl05/bin/python tests/data/verl/make_fixture_versions.py   # verl 0.5.0: no gts
    /tmp/fw/verl/bin/python tests/data/verl/make_fixture_versions.py     # verl 0.9.1: gts null, no extra info

- verl 0.5.0 (`versions/0.5.0/7.jsonl`): `RayPPOTrainer._dump_generations(inputs, outputs,
  scores, reward_extra_infos_dict, dump_path)`, with the arguments its `fit` loop passes for
  `trainer.rollout_data_dir` (`acc`, `pred` and the agent loop's `request_id`): no `gts` key.
- verl 0.9.1 (`versions/0.9.1-no-ground-truth/8.jsonl`): `RayPPOTrainer._log_rollout_data` on
  a batch of a dataset without `reward_model.ground_truth`, with a reward function that
  returned no extra info: `gts` null on every line, no `acc` / `pred`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import torch
import verl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "lm"))

from fixture_texts import ANSWERS, PROMPTS, RESPONSES, encode_prompt, pad_rows  # noqa: E402
from tiny_models import build_tokenizer  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402


def texts(tok, step: int) -> tuple[list[str], list[str], list[float], list[bool], list[str]]:
    inputs, outputs, scores, acc, pred = [], [], [], [], []
    for text, answer, responses in zip(PROMPTS, ANSWERS, RESPONSES, strict=True):
        for response in responses:
            inputs.append(tok.decode(encode_prompt(tok, text), skip_special_tokens=True))
            outputs.append(response)
            scores.append(1.0 if response == answer else 0.0)
            acc.append(response == answer)
            pred.append(response)
    return inputs, outputs, scores, acc, pred


def main() -> None:
    tok = build_tokenizer()
    if verl.__version__.startswith("0.5."):
        out = HERE / "versions" / f"{verl.__version__}"
        trainer = RayPPOTrainer.__new__(RayPPOTrainer)
        trainer.global_steps = 7
        inputs, outputs, scores, acc, pred = texts(tok, 7)
        shutil.rmtree(out, ignore_errors=True)
        extra = {"acc": acc, "pred": pred, "request_id": [f"req-7-{i}" for i in range(len(inputs))]}
        trainer._dump_generations(
            inputs=inputs, outputs=outputs, scores=scores, reward_extra_infos_dict=extra, dump_path=str(out)
        )
        return
    out = HERE / "versions" / f"{verl.__version__}-no-ground-truth"
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # only what _log_rollout_data reads
    trainer.tokenizer, trainer.global_steps = tok, 8
    trainer._init_dump_executor()
    prompts, responses, scores = [], [], []
    for text, answer, rows in zip(PROMPTS, ANSWERS, RESPONSES, strict=True):
        for response in rows:
            prompts.append(encode_prompt(tok, text))
            responses.append(tok.encode(response, add_special_tokens=False) + [tok.eos_token_id])
            scores.append(1.0 if response == answer else 0.0)
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
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer._log_rollout_data(batch, {}, {}, tmp)
        trainer._shutdown_dump_executor()
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for f in Path(tmp).glob("*.jsonl"):
            shutil.copy(f, out / f.name)


if __name__ == "__main__":
    main()
