"""Record `versions/<release>/` with an older skyrl release's own code: the same eval runs and
generator batches as make_fixture.py (which records skyrl 0.4.0), laid out as that release
lays them out. Run it in a throwaway Python 3.11 virtual environment that has the release
(never the project's); its `pip freeze` is `versions/<release>/requirements-fixture.txt`:

    python3.11 -m venv /work/venvs/skyrl-0.3.0
    /work/venvs/skyrl-0.3.0/bin/pip install torch==2.13.0
    /work/venvs/skyrl-0.3.0/bin/pip install --no-deps -r tests/data/skyrl/versions/0.3.0/requirements-fixture.txt
    PYTHONPATH=. /work/venvs/skyrl-0.3.0/bin/python tests/data/skyrl/make_fixture_versions.py

(the same for 0.2.0 and 0.1.0; msgspec is in each for gaca's writer). The rollouts, rewards and
log-probs are make_fixture.py's; what is the release's own:

- the eval dumps: its `evaluate` (`skyrl/train/evaluate.py`), or, for a step-wise run, its
  `evaluate_step_wise`, which the release's `RayPPOTrainer.eval` calls when
  `generator.step_wise_trajectories` is set (0.4.0 has one `evaluate` for both); both end in the
  release's `dump_per_dataset_eval_results`. The eval set is read by its `PromptDataset` and
  `build_dataloader` (0.1.0 and 0.2.0 have no `data.dataloader.num_workers`: their dataloader runs
  in-process with `generator.inference_engine.enable_http_endpoint`), the config is its default
  `SkyRLTrainConfig`.
- the generator output: `prepare_generator_input` (TrajectoryIDs, uids), its
  `validate_generator_output` (0.1.0 has no `step_wise` argument: its trainer does not validate
  step-wise output, so neither does this script), and only the fields the release's
  `GeneratorOutput` declares (0.1.0 and 0.2.0 have no `env_metrics` and no
  `trajectory_generation_times`). gaca's `write_generator_output` writes them.
"""

from __future__ import annotations

import inspect
import sys
import typing
from importlib.metadata import version
from pathlib import Path
from typing import Any

import typing_extensions

RELEASE = version("skyrl")
OUT = Path(__file__).resolve().parent / "versions" / RELEASE


def main() -> None:
    if sys.version_info < (3, 12) and RELEASE != "0.1.0":
        # skyrl 0.2.0 and 0.3.0 declare Python >= 3.11, but `import skyrl.train.evaluate` reaches
        # skyrl/tinker/types.py, whose pydantic models hold a `typing.TypedDict`, which pydantic
        # refuses before Python 3.12. Its drop-in, typing_extensions.TypedDict, is accepted; no
        # code that writes the files changes.
        typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]

    import make_fixture as fx  # make_fixture.py, next to this script: its rollouts, stand-in generator
    import skyrl.train.evaluate as skyrl_evaluate
    from skyrl.train.generators.base import GeneratorOutput
    from skyrl.train.utils.trainer_utils import validate_generator_output

    from gaca_cli.integrations.imports.skyrl import write_generator_output

    fields = set(GeneratorOutput.__annotations__)  # the fields this release's GeneratorOutput declares

    async def evaluate(eval_dataloader, generator, cfg, global_step, tokenizer):
        """What this release's `RayPPOTrainer.eval` calls: `evaluate_step_wise` for a step-wise
        run where the release has it, else `evaluate`."""
        step_wise = cfg.generator.step_wise_trajectories and hasattr(skyrl_evaluate, "evaluate_step_wise")
        run = skyrl_evaluate.evaluate_step_wise if step_wise else skyrl_evaluate.evaluate
        return await run(eval_dataloader, generator, cfg, global_step, tokenizer)

    def validate(num_prompts: int, output: dict[str, Any], step_wise: bool = False) -> None:
        if "step_wise" in inspect.signature(validate_generator_output).parameters:
            validate_generator_output(num_prompts, output, step_wise=step_wise)
        elif not step_wise:  # 0.1.0: RayPPOTrainer.generate validates only non-step-wise output
            validate_generator_output(num_prompts, output)

    def write(path: Path, output: dict[str, Any], uids, global_step: int) -> int:
        return write_generator_output(path, {k: v for k, v in output.items() if k in fields}, uids, global_step)

    OUT.mkdir(parents=True, exist_ok=True)
    fx.HERE, fx.evaluate, fx.validate_generator_output, fx.write_generator_output = OUT, evaluate, validate, write
    fx.eval_dumps()
    fx.stepwise()
    fx.batch()


if __name__ == "__main__":
    main()
