"""Re-record the TRL fixtures: real `GRPOTrainer(log_completions=True)` runs on CPU.

Run with a Python that has TRL (never the project's own venv; see README.md here):

    /tmp/fw/trl/bin/python tests/data/trl/make_fixture.py

Two runs of two optimizer steps each, on a tiny random-weight Llama built by
tests/lm/tiny_models.py (no model hub), with two reward functions:

- `standard/`: plain-text prompts, `reward_weights=[1.0, 0.5]`; `brevity` returns None for the
  garden task (TRL's multi-task convention: not applicable), which TRL writes as a null;
  `has_e` also logs an extra column `verdict` through TRL's `log_extra` hook.
- `conversational/`: chat prompts (system + user), default weights, no extra column.

TRL writes `<output_dir>/completions/completions_<global_step:05d>.parquet` at each logging
step; this script copies those files here and nothing else.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: where the tables go: here, or the folder named by the first argument (an older release's, e.g. `0.29`)
OUT = HERE / sys.argv[1] if len(sys.argv) > 1 else HERE
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lm"))

from tiny_models import build_model  # noqa: E402

TASKS = [
    "You are in the hall. A brass key lies on the table. Task: reach the garden.",
    "You are in the corridor. The garden door is locked. You carry a brass key.",
]


def _text(completion) -> str:
    """A completion's text: a string (standard) or the last message's content (conversational)."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def has_e(completions, prompts=None, log_extra=None, **kwargs) -> list[float]:
    """1.0 when the completion contains the letter e (a random model writes one now and then);
    in plain-text runs it also logs a `verdict` column."""
    texts = [_text(c) for c in completions]
    if log_extra is not None and isinstance(prompts[0], str):
        log_extra("verdict", ["e" if "e" in t else "no e" for t in texts])
    return [1.0 if "e" in t else 0.0 for t in texts]


def brevity(completions, prompts=None, **kwargs) -> list[float | None]:
    """Minus the completion's length in characters / 100; None (not applicable) for the task
    whose task is to reach the garden, in plain-text runs."""
    out: list[float | None] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if isinstance(prompt, str) and "reach the garden" in prompt:
            out.append(None)
        else:
            out.append(-len(_text(completion)) / 100.0)
    return out


def run(name: str, model_dir: Path, work: Path, conversational: bool, reward_weights) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    if conversational:
        rows = [
            {"prompt": [{"role": "system", "content": "You are an agent in a house."}, {"role": "user", "content": t}]}
            for t in TASKS
        ]
    else:
        rows = [{"prompt": t} for t in TASKS]
    args = GRPOConfig(
        output_dir=str(work / name),
        per_device_train_batch_size=6,
        num_generations=3,
        max_completion_length=10,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        log_completions=True,
        reward_weights=reward_weights,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[has_e, brevity],
        args=args,
        train_dataset=Dataset.from_list(rows * 3),
    )
    trainer.train()
    target = OUT / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for f in sorted((work / name / "completions").glob("*.parquet")):
        shutil.copy(f, target / f.name)
        print(f"wrote {target / f.name} ({f.stat().st_size} bytes)")


def main() -> None:
    import trl

    print(f"trl {trl.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_model(work / "tiny-llama", arch="llama", seed=0)
        run("standard", model_dir, work, conversational=False, reward_weights=[1.0, 0.5])
        run("conversational", model_dir, work, conversational=True, reward_weights=None)


if __name__ == "__main__":
    main()
