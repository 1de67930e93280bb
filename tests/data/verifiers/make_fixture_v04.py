"""Re-record the verifiers 0.4 fixture (`v04/`, see README.md) with verifiers' own code.

Run it in a virtual environment that has verifiers 0.4.0 (not the project's):

    python3 -m venv /tmp/vf04 && /tmp/vf04/bin/pip install --no-deps verifiers==0.4.0
    /tmp/vf04/bin/pip install pydantic numpy renderers typing_extensions httpx anthropic \
        prime-sandboxes aiohttp tomli-w math-verify
    /tmp/vf04/bin/python tests/data/verifiers/make_fixture_v04.py

No model is called. Each rollout's turns go through verifiers' own message-graph builder
(`verifiers.v1.graph.prepare_turn` -> `PendingTurn.commit` with a `Response` carrying
`TurnTokens`, as the renderer client hands them over; a tool result left after the last turn
goes through `PendingTurn.commit_prompt`), the model calls are recorded as `ModelCall`s the way
the interception server does, rewards and metrics with `Trace.record_reward` /
`Trace.record_metric`, and each finished `Episode` is appended to `traces.jsonl` by
`verifiers.v1.utils.trace_store.write_episode`, the function `vf-eval`'s runner
(`verifiers/v1/cli/eval/runner.py`, through `append_episode`) calls.

Token ids come from a toy renderer written here (one id per UTF-8 byte, plus role scaffold
ids from 100000), so that the token spans are consistent the way a real renderer's are.
`v04/math-tools--tiny-model--api/` is the same kind of run through an API client, which
hands over no tokens (`Response.tokens is None`): its nodes have no token ids or logprobs.
"""

from __future__ import annotations

import json
from pathlib import Path

from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.episode import EnvInfo, Episode, EvalRunInfo
from verifiers.v1.graph import prepare_turn
from verifiers.v1.task import Task, WireTaskData
from verifiers.v1.trace import AgentInfo, ModelCall, TimeSpan, Trace, TraceTask
from verifiers.v1.types import (
    AssistantMessage,
    Response,
    SamplingConfig,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    TurnTokens,
    Usage,
    UserMessage,
)
from verifiers.v1.utils.trace_store import TRACES_FILE, write_episode

HERE = Path(__file__).parent / "v04"
SYSTEM = SystemMessage(content="Answer with a number. You may call the calculator.")
CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression.",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)
OPEN = {"system": 100000, "user": 100001, "assistant": 100003, "tool": 100004}
END = 100002


def message_text(message) -> str:
    text = message.content or ""
    for call in getattr(message, "tool_calls", None) or []:
        text += f"<call {call.name} {call.arguments}>"
    return text


def render(messages) -> tuple[list[int], list[tuple[int, int]]]:
    """The toy renderer: `<role> text <end>` per message, then the generation prompt."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for m in messages:
        start = len(ids)
        ids += [OPEN[m.role], *message_text(m).encode(), END]
        spans.append((start, len(ids)))
    ids.append(OPEN["assistant"])
    return ids, spans


def completion(message) -> list[int]:
    return [*message_text(message).encode(), END]


def logprobs(ids: list[int], seed: int) -> list[float]:
    return [-((i * 7 + seed * 3) % 11) / 9.0 for i in range(len(ids))]


def rollout(task: Task, run: str, turns, *, tokens: bool, stop: str, trailing=None, seed: int = 0) -> Episode:
    trace = Trace(
        task=TraceTask(type="Task", data=task.data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=AgentConfig(model="tiny-model", max_turns=2)),
    )
    trace.timing.start = 1700000000.0 + seed
    prompt = [SYSTEM, UserMessage(content=task.data.prompt)]
    for turn, (reply, tool_result) in enumerate(turns):
        pending = prepare_turn(trace, prompt, [CALCULATOR])
        prompt_ids, spans = render(prompt)
        comp = completion(reply)
        turn_tokens = (
            TurnTokens(
                prompt_ids=prompt_ids,
                completion_ids=comp,
                completion_logprobs=logprobs(comp, seed * 10 + turn),
                message_spans=spans,
            )
            if tokens
            else None
        )
        usage = Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(comp))
        finish = "tool_calls" if reply.tool_calls else "stop"
        response = Response(
            id=f"resp-{seed}-{turn}",
            created=1700000000,
            model="tiny-model",
            message=reply,
            finish_reason=finish,
            usage=usage,
            tokens=turn_tokens,
        )
        node = pending.commit(response)
        trace.calls.append(
            ModelCall(
                node=node,
                model="tiny-model",
                sampling=SamplingConfig(temperature=1.0),
                endpoint="/chat/completions",
                finish_reason=finish,
                usage=usage,
                time=TimeSpan(start=1700000001.0 + turn, end=1700000001.5 + turn),
            )
        )
        prompt = [*prompt, reply] + ([tool_result] if tool_result is not None else [])
    if trailing is not None:  # the harness stopped before sending the tool result back
        prepare_turn(trace, prompt, [CALCULATOR]).commit_prompt()
    answer = message_text(turns[-1][0]).strip()
    correct = 1.0 if answer == task.data.answer else 0.0
    trace.record_reward("correct", correct)
    trace.record_reward("format", 1.0 if answer.isdigit() else 0.0, weight=0.2)
    trace.record_metric("num_tool_calls", sum(len(r.tool_calls or []) for r, _ in turns))
    trace.stop(stop)
    trace.ok = stop == "agent_completed"
    if not trace.ok:
        trace.info["note"] = "cut off at max_turns"
    return Episode(
        id=f"episode-{run}-{seed}",
        env=EnvInfo(id="math-tools"),
        task=trace.task,
        traces=[trace],
        ok=trace.ok,
        run=EvalRunInfo(id=run, name="math-tools eval"),
    )


def call(call_id: str, expression: str) -> ToolCall:
    return ToolCall(id=call_id, name="calculator", arguments=json.dumps({"expression": expression}))


def episodes(run: str, tokens: bool) -> list[Episode]:
    easy = Task(WireTaskData(idx=0, prompt="What is 2+3?", answer="5"))
    hard = Task(WireTaskData(idx=1, prompt="What is 17*23?", answer="391"))
    return [
        rollout(easy, run, [(AssistantMessage(content="5"), None)], tokens=tokens, stop="agent_completed", seed=0),
        rollout(easy, run, [(AssistantMessage(content="six"), None)], tokens=tokens, stop="agent_completed", seed=1),
        rollout(
            hard,
            run,
            [
                (
                    AssistantMessage(content="", tool_calls=[call("c1", "17*23")]),
                    ToolMessage(tool_call_id="c1", content="391", name="calculator"),
                ),
                (AssistantMessage(content="391", reasoning_content="The tool says 391."), None),
            ],
            tokens=tokens,
            stop="agent_completed",
            seed=2,
        ),
        rollout(
            hard,
            run,
            [
                (
                    AssistantMessage(content="Let me compute.", tool_calls=[call("c2", "17*22")]),
                    ToolMessage(tool_call_id="c2", content="374", name="calculator"),
                ),
                (
                    AssistantMessage(content="Almost.", tool_calls=[call("c3", "374+17")]),
                    ToolMessage(tool_call_id="c3", content="391", name="calculator"),
                ),
            ],
            tokens=tokens,
            stop="max_turns",
            trailing=True,
            seed=3,
        ),
    ]


def main() -> None:
    for name, tokens, count in (
        ("math-tools--tiny-model--renderer", True, 4),
        ("math-tools--tiny-model--api", False, 2),
    ):
        out = HERE / name
        out.mkdir(parents=True, exist_ok=True)
        (out / TRACES_FILE).write_text("")  # as `save_config` starts a run
        for episode in episodes(f"run-{name}", tokens)[-count:]:
            write_episode(out, episode)


if __name__ == "__main__":
    main()
