"""`gaca score` on windowed histories (the prompt rebuilt each step from a template, the task and
the last two turns, as verl-agent builds it): shared prefixes are forwarded once, and the numbers
are those of one full forward per step."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.lm.test_score import ACTIONS, OBSERVATIONS, assert_matches, reference_scores, score_lib, write_log
from tests.lm.tiny_models import sharing_arch

TASK = "You are an agent in a house. " + "Find the brass key, open the garden door and reach the garden. " * 8


def windowed_rows(groups: int = 2, rollouts: int = 4, steps: int = 4, window: int = 2, seed: int = 0) -> list[dict]:
    """Every rollout of a group starts from the same observation (identical step-0 contexts);
    later prompts hold the template, the task and the last `window` (observation, action) turns."""
    rng = random.Random(seed)
    rows = []
    for g in range(groups):
        first = rng.choice(OBSERVATIONS)
        for r in range(rollouts):
            turns: list[tuple[str, str]] = []
            obs = first
            for t in range(steps):
                recent = "".join(f"<|user|>{o}\n<|assistant|>{a}\n" for o, a in turns[-window:])
                prompt = f"<|system|>{TASK}Task {g}.\n{recent}<|user|>{obs}\n<|assistant|>"
                action = rng.choice(ACTIONS)
                rows.append(
                    {
                        "group_id": f"g{g}",
                        "traj_id": f"g{g}/r{r}",
                        "step_idx": t,
                        "reward": float(t == steps - 1),
                        "prompt": prompt,
                        "action": action,
                    }
                )
                turns.append((obs, action))
                obs = rng.choice(OBSERVATIONS)
    return rows


@pytest.mark.parametrize("arch", [sharing_arch(a) for a in ("llama", "gpt2")])
def test_shared_prefixes_give_the_full_forward_numbers_with_fewer_tokens(arch, tiny_llama, tiny_gpt2, tmp_path):
    model_dir = tiny_llama if arch == "llama" else tiny_gpt2
    rows = windowed_rows(seed=len(arch))
    log = write_log(tmp_path / "log.parquet", rows)
    ref = reference_scores(model_dir, rows, "prompt")
    runs = {}
    for share in (True, False):
        for budget in (1, 700, 100_000):  # every suffix alone .. everything in one batch
            run = score_lib(
                log,
                model_dir,
                tmp_path / f"{share}{budget}.parquet",
                share_prefixes=share,
                max_batch_tokens=budget,
                token_logprobs=True,
            )
            assert_matches(run.table, rows, ref, token_logprobs=True)
            runs[share, budget] = run.summary
    shared, plain = runs[True, 100_000], runs[False, 100_000]
    assert plain["shared_prefixes"] == 0 and plain["forwarded_tokens"] == plain["tokens"]
    assert shared["shared_prefixes"] >= 2  # at least the template of each group
    assert shared["forwarded_tokens"] < 0.75 * plain["forwarded_tokens"]
    assert shared["tokens"] == plain["tokens"] and shared["action_tokens"] == plain["action_tokens"]


def test_out_of_memory_backs_off_with_a_cached_prefix(tiny_llama, tmp_path, monkeypatch):
    """A batch of suffixes that 'does not fit' beside its cached prefix is halved until it does."""
    import torch

    from gaca_cli.lm import prefix

    original = prefix.suffix_logprobs

    def small_memory(scorer, kv, depth, seqs, spans):
        if len(seqs) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(scorer, kv, depth, seqs, spans)

    monkeypatch.setattr(prefix, "suffix_logprobs", small_memory)
    rows = windowed_rows(groups=1, seed=3)
    log = write_log(tmp_path / "log.parquet", rows)
    run = score_lib(log, tiny_llama, tmp_path / "out.parquet", max_batch_tokens=100_000)
    assert run.summary["oom_backoffs"] > 0 and run.summary["shared_prefixes"] > 0
    assert_matches(run.table, rows, reference_scores(tiny_llama, rows, "prompt"))


def test_a_model_whose_cache_disagrees_scores_without_sharing(tiny_llama, tmp_path, monkeypatch):
    from gaca_cli.lm import prefix

    monkeypatch.setattr(prefix, "prefix_cache_ok", lambda scorer: False)
    rows = windowed_rows(groups=1, seed=4)
    log = write_log(tmp_path / "log.parquet", rows)
    run = score_lib(log, tiny_llama, tmp_path / "out.parquet")
    assert run.summary["shared_prefixes"] == 0
    assert_matches(run.table, rows, reference_scores(tiny_llama, rows, "prompt"))


def test_cli_reports_forwarded_tokens(tiny_llama, tmp_path):
    import json

    from typer.testing import CliRunner

    from gaca_cli.cli import app

    log = write_log(tmp_path / "log.parquet", windowed_rows(groups=1, seed=5))
    res = CliRunner().invoke(
        app,
        ["score", str(log), "--model", str(tiny_llama), "--device", "cpu", "-o", str(tmp_path / "o.parquet"), "--json"],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert 0 < summary["forwarded_tokens"] < summary["tokens"] and summary["shared_prefixes"] > 0
    assert Path(tmp_path / "o.parquet").exists()
