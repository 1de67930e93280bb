"""Record the verl rollout dumps of `versions/` with each verl release line's own dumping code.

verl writes `gts` (the ground truth) from 0.6 on, and only the reward-extra-info lists the
reward function returned (`acc`, `pred`, ...): a dump may have both, either, or neither. Run
it once per release, each in a virtual environment of its own that has that verl (see
README.md here for the commands; never the project's own venv):

    /work/venvs/verl-0.4.1/bin/python tests/data/verl/make_fixture_versions.py  # checks: same file as 0.5.0
    /tmp/fw/verl05/bin/python tests/data/verl/make_fixture_versions.py          # verl 0.5.0: no gts
    /work/venvs/verl-0.6.1/bin/python tests/data/verl/make_fixture_versions.py  # verl 0.6.1: gts, no request_id
    /work/venvs/verl-0.7.1/bin/python tests/data/verl/make_fixture_versions.py  # checks: same file as 0.6.1
    /work/venvs/verl-0.8.0/bin/python tests/data/verl/make_fixture_versions.py  # checks: same file as 0.9.1
    /tmp/fw/verl/bin/python tests/data/verl/make_fixture_versions.py            # verl 0.9.1: gts null, no extra info

- verl 0.5.0 (`versions/0.5.0/7.jsonl`): `RayPPOTrainer._dump_generations(inputs, outputs,
  scores, reward_extra_infos_dict, dump_path)`, with the arguments its `fit` loop passes for
  `trainer.rollout_data_dir` (`acc`, `pred` and the agent loop's `request_id`): no `gts` key.
- verl 0.6.1 (`versions/0.6.1/9.jsonl`): `RayPPOTrainer._log_rollout_data` on a batch with
  `reward_model.ground_truth` and the agent loop's `request_id`, with the `acc` / `pred` lists
  `compute_reward` returned: `gts` on every line; no `request_id` (0.6 and 0.7 add it to the
  dict after copying it for the dump).
- verl 0.9.1 (`versions/0.9.1-no-ground-truth/8.jsonl`): `RayPPOTrainer._log_rollout_data` on
  a batch of a dataset without `reward_model.ground_truth`, with a reward function that
  returned no extra info: `gts` null on every line, no `acc` / `pred`.

The other lines have the same dumping methods (source compared) as a recorded one; run in
their release, the script writes the recorded line's call to a temporary folder and checks the
file is the same bytes: 0.4.1 (`_dump_generations` of 0.5.0; its `fit` passes no `request_id`),
0.7.1 (`_dump_generations` and `_log_rollout_data` of 0.6.1; with the numpy arrays its `fit`
passes, a bool `acc` makes the dump raise TypeError), 0.8.0 (`_log_rollout_data`, `_dump_generations`, `_write_generations` of
0.9.1). verl 0.3 writes no rollout dump.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
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


def dump_05(tok, out: Path) -> None:
    """verl 0.4 / 0.5: the `_dump_generations` call of `fit` (no gts argument)."""
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.global_steps = 7
    inputs, outputs, scores, acc, pred = texts(tok, 7)
    extra = {"acc": acc, "pred": pred, "request_id": [f"req-7-{i}" for i in range(len(inputs))]}
    trainer._dump_generations(
        inputs=inputs, outputs=outputs, scores=scores, reward_extra_infos_dict=extra, dump_path=str(out)
    )


def rollout_batch(tok, ground_truth: bool) -> DataProto:
    """The batch `fit` hands `_log_rollout_data`: padded prompts and responses, the score on each
    response's last token, and (with `ground_truth`) the dataset's `reward_model` and the agent
    loop's `request_id`."""
    prompts, responses, scores, gts = [], [], [], []
    for text, answer, rows in zip(PROMPTS, ANSWERS, RESPONSES, strict=True):
        for response in rows:
            prompts.append(encode_prompt(tok, text))
            responses.append(tok.encode(response, add_special_tokens=False) + [tok.eos_token_id])
            scores.append(1.0 if response == answer else 0.0)
            gts.append(answer)
    response_tensor = pad_rows(responses, tok.pad_token_id, left=False)
    token_level_scores = torch.zeros(response_tensor.shape, dtype=torch.float32)
    for i, ids in enumerate(responses):
        token_level_scores[i, len(ids) - 1] = scores[i]
    non_tensors = {}
    if ground_truth:
        non_tensors = {
            "reward_model": np.array([{"style": "rule", "ground_truth": gt} for gt in gts], dtype=object),
            "request_id": np.array([f"req-9-{i}" for i in range(len(gts))], dtype=object),
        }
    return DataProto.from_dict(
        tensors={
            "prompts": pad_rows(prompts, tok.pad_token_id, left=True),
            "responses": response_tensor,
            "token_level_scores": token_level_scores,
        },
        non_tensors=non_tensors,
    )


def dump_06(tok, out: Path) -> None:
    """verl 0.6 / 0.7: `_log_rollout_data` with gts and the reward function's `acc`, `pred` as
    the lists 0.6's `compute_reward` returns. 0.7's `fit` passes the batch's numpy arrays
    (`extract_reward`; the agent loop made them with `np.array`), whose `np.bool_` items `json`
    cannot write: checked here to fail with TypeError (verl 0.8 writes `.tolist()`)."""
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # only what _log_rollout_data reads
    trainer.tokenizer, trainer.global_steps = tok, 9
    _, _, _, acc, pred = texts(tok, 9)
    if verl.__version__.startswith("0.7."):
        arrays = {"acc": np.array(acc), "pred": np.array(pred)}
        with tempfile.TemporaryDirectory() as tmp:
            try:
                trainer._log_rollout_data(rollout_batch(tok, ground_truth=True), arrays, {}, tmp)
            except TypeError as e:
                print(f"verl {verl.__version__}, numpy bool acc: {e}")
            else:
                raise AssertionError("verl 0.7 wrote numpy bools")
    trainer._log_rollout_data(rollout_batch(tok, ground_truth=True), {"acc": acc, "pred": pred}, {}, str(out))


def dump_09(tok, out: Path) -> None:
    """verl 0.8 / 0.9: `_log_rollout_data` (written by the dump executor) on a batch without
    ground truths, with a reward function that returned no extra info."""
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # only what _log_rollout_data reads
    trainer.tokenizer, trainer.global_steps = tok, 8
    trainer._init_dump_executor()
    trainer._log_rollout_data(rollout_batch(tok, ground_truth=False), {}, {}, str(out))
    trainer._shutdown_dump_executor()


LINES = {  # release line: (how it dumps, the folder it records, or the recorded folder it must equal)
    "0.4.": (dump_05, "0.5.0", True),
    "0.5.": (dump_05, "0.5.0", False),
    "0.6.": (dump_06, "0.6.1", False),
    "0.7.": (dump_06, "0.6.1", True),
    "0.8.": (dump_09, "0.9.1-no-ground-truth", True),
    "0.9.": (dump_09, "0.9.1-no-ground-truth", False),
}


def main() -> None:
    tok = build_tokenizer()
    dump, folder, check = next(v for k, v in LINES.items() if verl.__version__.startswith(k))
    out = HERE / "versions" / folder
    with tempfile.TemporaryDirectory() as tmp:
        dump(tok, Path(tmp))
        files = sorted(Path(tmp).glob("*.jsonl"))
        if check:
            for f in files:
                assert f.read_bytes() == (out / f.name).read_bytes(), f"{f.name} differs from {out}"
            print(f"verl {verl.__version__} writes the same {[f.name for f in files]} as versions/{folder}")
            return
        assert verl.__version__ == folder.split("-")[0], verl.__version__
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for f in files:
            shutil.copy(f, out / f.name)
        print(f"verl {verl.__version__} wrote versions/{folder}/{[f.name for f in files]}")


if __name__ == "__main__":
    main()
