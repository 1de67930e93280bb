"""Record `versions/<release>/` (results.jsonl + metadata.json) with an older verifiers release's
own saving code: the same four rollouts as make_fixture.py (two examples x two: a one-turn
right answer, a wrong one, a tool-calling chat, and one cut off after a tool result).

Run it in a throwaway virtual environment that has that release (never the project's):

    python3 -m venv /tmp/vf0.1.5 && /tmp/vf0.1.5/bin/pip install --no-deps verifiers==0.1.5
    /tmp/vf0.1.5/bin/pip install datasets openai openai-agents pydantic httpx rich jinja2 nest-asyncio
    /tmp/vf0.1.5/bin/python tests/data/verifiers/make_fixture_versions.py

(the same for 0.1.14 and 0.2.1, plus the modules their `import verifiers` asks for: tenacity,
renderers, ...). What writes the files:

- 0.1.0 to 0.1.5: `vf-eval -s`'s own `eval_environment` (`verifiers/scripts/eval.py`), run as
  it is on an environment whose `evaluate` returns these rollouts (no model is called): its
  save block builds a `datasets.Dataset` (`id`, printable `prompt` / `completion`, `task`,
  timings, `info`, `answer`, `reward`, one column per rubric function) and writes it with
  `Dataset.to_json`, and `metadata.json` with `env`, `model`, averages.
- 0.1.14 and 0.2.1: `state_to_output` -> `save_outputs`, and
  `GenerateOutputsBuilder` -> `save_metadata`, from `verifiers/utils/save_utils.py`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import verifiers as vf

OUT = Path(__file__).resolve().parent / "versions" / vf.__version__
SYSTEM = {"role": "system", "content": "Answer with a number. You may call the calculator."}
QUESTIONS = [("What is 2+3?", "5"), ("What is 17*23?", "391")]


def tool_call(call_id: str, expression: str) -> dict:
    arguments = '{"expression": "' + expression + '"}'
    return {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}


# (example, completion, reward, metrics, truncated)
ROLLOUTS = [
    (0, [{"role": "assistant", "content": "5"}], 1.0, {"correct": 1.0, "format": 1.0}, False),
    (0, [{"role": "assistant", "content": "six"}], 0.0, {"correct": 0.0, "format": 0.0}, False),
    (
        1,
        [
            {"role": "assistant", "content": "", "tool_calls": [tool_call("c1", "17*23")]},
            {"role": "tool", "content": "391", "tool_call_id": "c1"},
            {"role": "assistant", "content": "391"},
        ],
        1.0,
        {"correct": 1.0, "format": 1.0},
        False,
    ),
    (
        1,
        [
            {"role": "assistant", "content": "Let me compute.", "tool_calls": [tool_call("c2", "17*22")]},
            {"role": "tool", "content": "374", "tool_call_id": "c2"},
        ],
        0.0,
        {"correct": 0.0, "format": 0.0},
        True,
    ),
]


def prompt(example: int) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": QUESTIONS[example][0]}]


def with_eval_script() -> None:
    """0.1.0-0.1.5: run `eval_environment` on an environment that returns ROLLOUTS."""
    from openai.types.chat import ChatCompletionMessageToolCall
    from verifiers.scripts import eval as vf_eval
    from verifiers.types import GenerateOutputs

    def as_sent(message: dict) -> dict:  # the client's tool calls are openai objects then
        calls = [ChatCompletionMessageToolCall.model_validate(c) for c in message.get("tool_calls", [])]
        return {**message, "tool_calls": calls} if calls else message

    # evaluate() returns rollout r of every example before rollout r + 1 (the script's `id`s)
    order = [0, 2, 1, 3]
    rollouts = [(e, [as_sent(m) for m in c], *rest) for e, c, *rest in (ROLLOUTS[i] for i in order)]

    class Environment:
        def evaluate(self, **kwargs):
            return GenerateOutputs.model_construct(  # as evaluate() holds them: openai objects
                prompt=[prompt(e) for e, *_ in rollouts],
                completion=[c for _, c, *_ in rollouts],
                answer=[QUESTIONS[e][1] for e, *_ in rollouts],
                state=[{"timing": {"generation_ms": 120.0, "scoring_ms": 3.0, "total_ms": 123.0}} for _ in rollouts],
                info=[{"difficulty": "easy" if e == 0 else "medium"} for e, *_ in rollouts],
                task=["math"] * len(rollouts),
                reward=[r for _, _, r, *_ in rollouts],
                metrics={k: [m[k] for *_, m, _ in rollouts] for k in ("correct", "format")},
            )

    vf.load_environment = lambda env_id, **kwargs: Environment()
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            vf_eval.eval_environment(
                env="math-tools", env_args={}, env_dir_path="./environments", endpoints_path="./configs/endpoints.py",
                model="tiny-model", api_key_var="OPENAI_API_KEY", api_base_url="http://localhost:1/v1",
                num_examples=2, rollouts_per_example=2, max_concurrent=1, max_tokens=64, temperature=1.0,
                sampling_args=None, verbose=False, save_dataset=True, save_to_hf_hub=False, hf_hub_dataset_name="",
                extra_headers={},
            )  # fmt: skip
        finally:
            os.chdir(here)
        (run,) = Path(tmp, "outputs", "evals").glob("*/*")
        for name in ("results.jsonl", "metadata.json"):
            shutil.copy(run / name, OUT / name)


def with_save_utils() -> None:
    """0.1.14, 0.2.1: state_to_output, save_outputs, GenerateOutputsBuilder, save_metadata."""
    from verifiers.types import RolloutTiming, State
    from verifiers.utils.save_utils import GenerateOutputsBuilder, save_metadata, save_outputs, state_to_output

    states = []
    for example, completion, reward, metrics, truncated in ROLLOUTS:
        s = State()
        s["input"] = {
            "prompt": prompt(example),
            "answer": QUESTIONS[example][1],
            "info": {"difficulty": "easy" if example == 0 else "medium"},
            "example_id": example,
        }
        s["task"] = "math"
        s.update(completion=completion, reward=reward, metrics=metrics, timing=RolloutTiming(start_time=1700000000.0))
        s.update(is_completed=not truncated, is_truncated=truncated)
        s["stop_condition"] = "max_turns_reached" if truncated else "answered"
        states.append(s)
    outputs = [state_to_output(s, state_columns=["task"]) for s in states]
    save_outputs(outputs, OUT)
    builder = GenerateOutputsBuilder(
        env_id="math-tools", env_args={}, model="tiny-model", client=object(), num_examples=2,
        rollouts_per_example=2, state_columns=["task"], sampling_args={"temperature": 1.0}, results_path=OUT,
    )  # fmt: skip
    builder.add_outputs(outputs)
    save_metadata(builder.build_metadata(), OUT)


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    try:
        import verifiers.utils.save_utils  # noqa: F401
    except ImportError:
        with_eval_script()
    else:
        with_save_utils()


if __name__ == "__main__":
    main()
