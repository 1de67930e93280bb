"""Record `versions/<ms-swift version>/` with an ms-swift 3.x release's own GRPO trainer.

ms-swift 3.x lays out `completions.jsonl` differently from release to release (4.x writes
the layout of 3.8 on); each file here is written by a real GRPO run on CPU of that release's
own `swift.llm.rlhf_main`, the same run as `make_fixture.py` (a tiny random-weight Qwen2 from
tests/lm/tiny_models.py, no model hub; two reward functions from an external plugin,
`reward_weights=[1.0, 0.5]`; a `solution` column; two optimizer steps, logging every step).
Run it once per release, each in a virtual environment of its own that has that ms-swift
(see README.md here for the commands; never the project's own venv):

    /work/venvs/swift-3.12.6/bin/python tests/data/swift/make_fixture_versions.py

What each release's `GRPOTrainer.log` (swift/trainers/rlhf_trainer/grpo_trainer.py) writes:

- 3.1.1 (the first with GRPO), 3.2: at each generation batch (`_prepare_inputs`, from 3.2
  `_generate_and_score_completions`), `step` (the global step before the batch's optimizer
  step), `messages` (the chat before the completion), `completion`, `reward` (the weighted
  total); no function's own value, no advantages.
- 3.3, 3.4: `step`, `prompt` (the chat messages, not templated), `completion`, one column
  per reward function; no advantages.
- 3.5, 3.6: the same with `prompt` the templated text.
- 3.7: then `advantage` (singular), and `entropy` with `log_entropy` (added in 3.7; set here
  from 3.7 on).
- 3.8 to 3.12 (and 4.x): `advantages`, then the other logged columns (`solution`, `entropy`).

The `args.json` ms-swift saves beside the file (which holds `reward_weights`) is copied too.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "lm"))
sys.path.insert(0, str(HERE))

from make_fixture import PLUGIN as PLUGIN_4X  # noqa: E402
from make_fixture import ROWS, grpo_arguments  # noqa: E402
from tiny_models import build_model  # noqa: E402

# make_fixture.py's reward functions; ms-swift 3.x keeps ORM and orms in swift.plugin
PLUGIN = PLUGIN_4X.replace("from swift.rewards.orm import", "from swift.plugin import")


def main() -> None:
    from swift.llm import RLHFArguments, rlhf_main

    version = importlib.metadata.version("ms-swift")
    minor = tuple(int(p) for p in version.split(".")[:2])
    print("ms-swift", version)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_model(work / "tiny-qwen2", arch="qwen2", seed=0)
        (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS * 2))
        (work / "plugin.py").write_text(PLUGIN)
        args = RLHFArguments(
            **grpo_arguments(work, model_dir),
            gradient_accumulation_steps=1,  # the GRPO default from 3.7 on; before, 16 / batch size
            # before 3.2, the end of training reads the last checkpoint's path, set only by a save
            save_strategy="no" if minor >= (3, 2) else "steps",
            save_steps=2,
            train_type="full",
            **({"log_entropy": True} if minor >= (3, 7) else {}),
        )
        rlhf_main(args)
        (written,) = (work / "out").glob("**/completions.jsonl")
        target = HERE / "versions" / version
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shutil.copy(written, target / "completions.jsonl")
        shutil.copy(written.parent / "args.json", target / "args.json")
        print("written", target)


if __name__ == "__main__":
    main()
