"""Re-record the verifiers fixture of this folder (see README.md) with verifiers' own saving code.

Run it in a virtual environment that has verifiers 0.3.1 (not the project's):

    python3 -m venv /tmp/vf && /tmp/vf/bin/pip install --no-deps verifiers==0.3.1
    /tmp/vf/bin/pip install datasets openai pydantic anthropic renderers httpx
    /tmp/vf/bin/python tests/data/verifiers/make_fixture.py

It builds the rollout `State`s an evaluation ends with (two examples, two rollouts each: a
single-turn answer and a multi-turn tool-calling chat) and writes them exactly as `vf-eval -s`
does: `state_to_output` -> `save_outputs` (results.jsonl), and `GenerateOutputsBuilder` ->
`save_metadata` (metadata.json), from verifiers/legacy/utils/save_utils.py.
"""

from __future__ import annotations

from pathlib import Path

from verifiers.legacy.types import RolloutTiming, State
from verifiers.legacy.utils.save_utils import (
    GenerateOutputsBuilder,
    save_metadata,
    save_outputs,
    state_to_output,
)

OUT = Path(__file__).parent / "evals" / "math-tools--tiny-model" / "run0"

SYSTEM = {"role": "system", "content": "Answer with a number. You may call the calculator."}


def state(example_id, question, answer, completion, reward, metrics, *, truncated=False, stop="answered"):
    s = State()
    s["input"] = {
        "prompt": [SYSTEM, {"role": "user", "content": question}],
        "answer": answer,
        "info": {"difficulty": "easy" if example_id == 0 else "medium"},
        "example_id": example_id,
    }
    s["task"] = "math"
    s["completion"] = completion
    s["reward"] = reward
    s["metrics"] = metrics
    s["timing"] = RolloutTiming(start_time=1700000000.0)
    s["is_completed"] = not truncated
    s["is_truncated"] = truncated
    s["stop_condition"] = stop
    return s


def tool_call(call_id, expression):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "' + expression + '"}'},
    }


def main() -> None:
    states = [
        state(0, "What is 2+3?", "5", [{"role": "assistant", "content": "5"}], 1.0, {"correct": 1.0, "format": 1.0}),
        state(0, "What is 2+3?", "5", [{"role": "assistant", "content": "six"}], 0.0, {"correct": 0.0, "format": 0.0}),
        state(
            1,
            "What is 17*23?",
            "391",
            [
                {"role": "assistant", "content": "", "tool_calls": [tool_call("c1", "17*23")]},
                {"role": "tool", "content": "391", "tool_call_id": "c1"},
                {"role": "assistant", "content": "391"},
            ],
            1.0,
            {"correct": 1.0, "format": 1.0},
        ),
        state(
            1,
            "What is 17*23?",
            "391",
            [
                {"role": "assistant", "content": "Let me compute.", "tool_calls": [tool_call("c2", "17*22")]},
                {"role": "tool", "content": "374", "tool_call_id": "c2"},
            ],
            0.0,
            {"correct": 0.0, "format": 0.0},
            truncated=True,
            stop="max_turns_reached",
        ),
    ]
    outputs = [state_to_output(s, state_columns=["task"]) for s in states]
    (OUT / "results.jsonl").unlink(missing_ok=True)
    save_outputs(outputs, OUT)
    builder = GenerateOutputsBuilder(
        env_id="math-tools",
        env_args={},
        model="tiny-model",
        client=object(),
        num_examples=2,
        rollouts_per_example=2,
        state_columns=["task"],
        sampling_args={"temperature": 1.0},
        results_path=OUT,
    )
    builder.add_outputs(outputs)
    save_metadata(builder.build_metadata(), OUT)


if __name__ == "__main__":
    main()
