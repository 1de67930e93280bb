"""Benchmark: which library declares the importers' records (issue: declared importers).

Compares, for one record shape (a verifiers rollout line: ids, a reward, a dict of metric
scores, a chat of messages), the checks written by hand (the baseline, as the importers had
them) with the same record declared once in pydantic v2 and in msgspec:

- the import cost: a fresh `python -c "import X"` per library, median of several runs, minus
  a bare interpreter's start;
- the checking speed: records per second, strict types (no bool for a number, no string for
  an integer), on records already parsed from JSON (the importers parse first, to name the line).

It prints one table with each figure and the ratio against the hand-written checks.

The choice it informed: msgspec. On the development machine (busy, 2 cores, two runs) msgspec checks about as
fast as the hand-written code (0.9-1.2x) and pydantic v2 at a quarter of that speed (0.23-0.25x), which
a multi-gigabyte import would feel; pydantic's import cost would be free inside gaca (typer
loads it when it parses a command's options) and msgspec adds ~1.5 ms there
(`python -X importtime -m gaca_cli import ...`), so speed decides.

    python bench/import_validation.py              # 20,000 records, 5 interpreter starts
    python bench/import_validation.py --records 2000 --starts 3

msgspec is not a dependency: install it somewhere on PYTHONPATH to compare it
(`pip install --target /tmp/msgspec_pkg msgspec; PYTHONPATH=/tmp/msgspec_pkg python bench/...`).
"""

import argparse
import math
import statistics
import subprocess
import sys
import time
from typing import Any


def record(i: int) -> dict[str, Any]:
    chat = [{"role": "system", "content": "Answer."}, {"role": "user", "content": f"What is {i} + 1?"}]
    completion = [
        {"role": "assistant", "content": "", "tool_calls": ['{"name": "add"}']},
        {"role": "tool", "content": str(i + 1), "tool_call_id": "c1"},
        {"role": "assistant", "content": str(i + 1)},
    ]
    return {
        "example_id": i // 4,
        "reward": 1.0,
        "metrics": {"correct": 1.0, "format": 0.5},
        "prompt": chat,
        "completion": completion,
        "is_completed": True,
        "info": {"k": i},
    }


def by_hand(rec: Any) -> None:
    """The checks as the importers wrote them (one `if` and one message per rule)."""
    if not isinstance(rec, dict):
        raise ValueError("expected a JSON object")
    ex = rec.get("example_id")
    if ex is None:
        raise ValueError("example_id: missing")
    if isinstance(ex, bool) or not isinstance(ex, (int, str)):
        raise ValueError("example_id: must be an integer or a string")
    r = rec.get("reward")
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
        raise ValueError("reward: must be a number")
    metrics = rec.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise ValueError("metrics: must be an object")
    for v in metrics.values():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError("metrics: must be a number")
    for key in ("prompt", "completion"):
        value = rec.get(key)
        if not isinstance(value, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
        ):
            raise ValueError(f"{key}: must be a list of chat messages")
    if not isinstance(rec.get("is_completed", True), bool):
        raise ValueError("is_completed: must be true or false")


def pydantic_checker() -> Any:
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, TypeAdapter

    Number = Annotated[StrictFloat | StrictInt, Field(allow_inf_nan=False)]

    class Message(BaseModel):
        model_config = ConfigDict(extra="allow")
        role: StrictStr

    class Rollout(BaseModel):
        model_config = ConfigDict(extra="allow")
        example_id: StrictInt | StrictStr
        reward: Number
        metrics: dict[str, Number | None] = {}
        prompt: list[Message]
        completion: list[Message]
        is_completed: StrictBool = True

    return TypeAdapter(Rollout).validate_python


def msgspec_checker() -> Any:
    import msgspec

    class Message(msgspec.Struct, forbid_unknown_fields=False):
        role: str

    class Rollout(msgspec.Struct, forbid_unknown_fields=False):
        example_id: int | str
        reward: float
        prompt: list[Message]
        completion: list[Message]
        metrics: dict[str, float | None] = {}
        is_completed: bool = True

    return lambda rec: msgspec.convert(rec, Rollout, strict=True)


def import_seconds(statement: str, starts: int) -> float:
    times = []
    for _ in range(starts):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def records_per_second(check: Any, records: list[dict[str, Any]]) -> float:
    check(records[0])  # warm (pydantic builds its validator lazily)
    t0 = time.perf_counter()
    for rec in records:
        check(rec)
    return len(records) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    records = [record(i) for i in range(args.records)]
    bare = import_seconds("pass", args.starts)
    rows = [("by hand (baseline)", 0.0, records_per_second(by_hand, records))]
    rows.append(("pydantic v2", import_seconds("import pydantic", args.starts) - bare, 0.0))
    rows[-1] = (rows[-1][0], rows[-1][1], records_per_second(pydantic_checker(), records))
    try:
        import msgspec  # noqa: F401

        cost = import_seconds("import msgspec", args.starts) - bare
        rows.append(("msgspec", cost, records_per_second(msgspec_checker(), records)))
    except ImportError:
        print("msgspec is not installed: its row is left out", file=sys.stderr)
    base = rows[0][2]
    print(f"{'checks':<20} {'import ms':>10} {'records/s':>12} {'speed vs hand':>14}")
    for name, cost, speed in rows:
        print(f"{name:<20} {cost * 1000:>10.1f} {speed:>12,.0f} {speed / base:>13.2f}x")


if __name__ == "__main__":
    main()
