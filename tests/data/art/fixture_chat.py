"""The chats both ART fixture scripts log (make_fixture.py, make_fixture_versions.py): a text
adventure with one tool, `look`. Needs only openai's types, so every ART release can run it."""

from __future__ import annotations

from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall, Function

SYSTEM = "You play a text adventure. Answer with one command."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "look",
            "description": "Describe the room.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def choice(content: str | None, tool_call: tuple[str, str, str] | None = None) -> Choice:
    calls = None
    if tool_call is not None:
        call_id, name, arguments = tool_call
        calls = [
            ChatCompletionMessageToolCall(
                id=call_id, type="function", function=Function(name=name, arguments=arguments)
            )
        ]
    return Choice(
        finish_reason="tool_calls" if calls else "stop",
        index=0,
        message=ChatCompletionMessage(role="assistant", content=content, tool_calls=calls),
    )


def chat(task: str, moves: list[str]) -> list:
    """System, task, a `look` tool call and its answer, then per move a sampled assistant turn
    and the game's answer (none after the last)."""
    messages: list = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task: {task}. You are in the hall."},
        choice(None, ("call_0", "look", "{}")),
        {"role": "tool", "tool_call_id": "call_0", "content": "A hall. A key lies on the floor."},
    ]
    for i, move in enumerate(moves):
        messages.append(choice(move))
        if i < len(moves) - 1:
            messages.append({"role": "user", "content": f"You did: {move}."})
    return messages


def few_shot() -> list:
    """A hand-written assistant turn (a plain dict, not a sampled Choice: ART does not train on
    it) before the task, answered by a sampled turn."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Example task: wait."},
        {"role": "assistant", "content": "wait"},
        {"role": "user", "content": "Task: go north. You are in the hall."},
        choice("go north"),
    ]
