"""Re-record the `gaca import --from swift` fixtures: a real ms-swift GRPO run on CPU.

Run with a Python that has ms-swift (never the project's own venv; see README.md here):

    /tmp/fw/swift/bin/python tests/data/swift/make_fixture.py

`swift rlhf --rlhf_type grpo` (through `swift.pipelines.rlhf_main`) runs two optimizer steps
of a tiny random-weight Qwen2 built by tests/lm/tiny_models.py (no model hub), with
`log_completions=True`, two reward functions registered through an external plugin (`HasE`,
`Brevity`, `reward_weights=[1.0, 0.5]`), `log_entropy=True`, and a dataset with a `solution`
column (which the trainer logs). GRPOTrainer.log (swift/rlhf_trainers/grpo_trainer.py) appends
one line per logging step to `<output_dir>/<version>/completions.jsonl`; this script copies
that file, and the `args.json` ms-swift saves beside it (which holds `reward_weights`), to
`grpo/`.

It also writes `ray_driver/completions.jsonl` in the layout of the Ray driver
(`swift/ray/megatron/base_trainer.py`, `_maybe_log_completions`: one line per completion,
`gen_step`, `prompt`, `completion`, `reward`), with swift's own `JsonlWriter`, from the same
prompts and completions: the Ray trainer itself needs Ray and Megatron and was not run.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lm"))

from tiny_models import build_model  # noqa: E402

PLUGIN = """
from swift.rewards.orm import ORM, orms


class HasE(ORM):
    def __call__(self, completions, **kwargs):
        return [1.0 if "e" in c else 0.0 for c in completions]


class Brevity(ORM):
    def __call__(self, completions, **kwargs):
        return [-len(c) / 100.0 for c in completions]


orms["has_e"] = HasE
orms["brevity"] = Brevity
"""


def grpo_arguments(work: Path, model_dir: Path) -> dict:
    """The GRPO run both fixture scripts record, as keyword arguments of ms-swift's RLHFArguments
    (those every release since 3.1 takes alike): two reward functions, weights 1 and 0.5,
    completions logged."""
    return {
        "rlhf_type": "grpo",
        "model": str(model_dir),
        "model_type": "qwen2",
        "template": "qwen",
        "dataset": [str(work / "data.jsonl")],
        "external_plugins": [str(work / "plugin.py")],
        "reward_funcs": ["has_e", "brevity"],
        "reward_weights": [1.0, 0.5],
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 8,
        "max_steps": 2,
        "logging_steps": 1,
        "log_completions": True,
        "output_dir": str(work / "out"),
        "report_to": ["none"],
        "torch_dtype": "float32",
        "learning_rate": 1e-3,
        "seed": 0,
        "dataset_num_proc": 1,
        "split_dataset_ratio": 0,
        "use_hf": True,
    }


ROWS = [
    {
        "messages": [
            {"role": "system", "content": "You are an agent in a house."},
            {"role": "user", "content": "You are in the hall. Task: reach the garden."},
        ],
        "solution": "go to garden",
    },
    {
        "messages": [{"role": "user", "content": "You are in the corridor. The garden door is locked."}],
        "solution": "open door with key",
    },
]


def main() -> None:
    import importlib.metadata

    from swift.arguments import RLHFArguments
    from swift.pipelines import rlhf_main
    from swift.utils.io_utils import JsonlWriter

    print("ms-swift", importlib.metadata.version("ms-swift"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_model(work / "tiny-qwen2", arch="qwen2", seed=0)
        (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS * 2))
        (work / "plugin.py").write_text(PLUGIN)
        args = RLHFArguments(**grpo_arguments(work, model_dir), log_entropy=True, save_strategy="no", tuner_type="full")
        rlhf_main(args)
        (written,) = (work / "out").glob("*/completions.jsonl")
        target = HERE / "grpo"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        shutil.copy(written, target / "completions.jsonl")
        shutil.copy(written.parent / "args.json", target / "args.json")

    # the Ray driver's layout: one line per completion (rows as _maybe_log_completions builds them)
    first = json.loads((HERE / "grpo" / "completions.jsonl").read_text().splitlines()[0])
    weights = (1.0, 0.5)
    rows = [
        {
            "gen_step": int(first["step"][i]),
            "prompt": first["prompt"][i],
            "completion": first["completion"][i],
            "reward": float(weights[0] * first["HasE"][i] + weights[1] * first["Brevity"][i]),
        }
        for i in range(len(first["prompt"]))
    ]
    target = HERE / "ray_driver"  # not "ray": this folder is on sys.path and would shadow that package
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    JsonlWriter(str(target / "completions.jsonl")).append(rows)
    print("written under", HERE)


if __name__ == "__main__":
    main()
