"""`gaca score` against its slow twin: one full-logits forward per step, log_softmax, gather.

On the CPU in fp32 (`--device cpu` wherever numbers are compared, also on a machine with a
GPU; tests/lm/test_cuda.py checks the GPU).

The twin (`reference_scores`) tokenises each step on its own, runs the model over the whole
context + action, takes float32 log_softmax over the full vocabulary and gathers the action
tokens: the definition of the NLL, with none of the fast path's tricks (packing, dedupe,
batching with right padding, projection at action positions only, chunked log-softmax).
Both run on tiny random-weight models saved to a directory and loaded by path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.log import columns as C

runner = CliRunner()
TOL = 1e-5

OBSERVATIONS = [
    "You are in the hall. A brass key lies on the table.",
    "You are in the corridor. The garden door is locked.",
    "You carry a brass key.",
    "north south east west",
]
ACTIONS = ["go to hall", "go to garden", "take key", "look around", "open door with key", "examine 7"]


def render(messages: list[dict]) -> str:
    """tests/lm/tiny_models.py's chat template, by hand, generation prompt added."""
    return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"


def make_rows(
    *, groups: int = 2, trajs: int = 3, steps: int = 4, rewrite: bool = False, seed: int = 0, duplicate: bool = True
) -> list[dict]:
    """Multi-turn rollouts: an append-only chat history (packable), or with `rewrite` a history
    replaced by a summary at every step (no step is a prefix of the next). With `duplicate`,
    the last trajectory of group 0 repeats the first one under another traj_id."""
    rng = random.Random(seed)
    rows: list[dict] = []
    for g in range(groups):
        system = {"role": "system", "content": f"You are an agent in a house. Task: reach the garden {g}"}
        played: list[list[tuple[str, str]]] = []
        for r in range(trajs):
            script = (
                played[0]
                if duplicate and g == 0 and r == trajs - 1
                else [(rng.choice(OBSERVATIONS), rng.choice(ACTIONS)) for _ in range(steps)]
            )
            played.append(script)
            history = [system]
            for t, (obs, action) in enumerate(script):
                if rewrite:
                    history = [system, {"role": "user", "content": f"Step {t}. {obs}"}]
                else:
                    history.append({"role": "user", "content": obs})
                rows.append(
                    {
                        "group_id": f"g{g}",
                        "traj_id": f"g{g}/r{r}",
                        "step_idx": t,
                        "reward": float(t == steps - 1),
                        "prompt": render(history),
                        "messages": [dict(m) for m in history],
                        "action": action,
                        "extra": f"kept {g}-{r}-{t}",
                    }
                )
                history.append({"role": "assistant", "content": action})
    return rows


def add_token_ids(rows: list[dict], tokenizer, rewrite: bool = False) -> list[dict]:
    """Token-id columns built the way an inference server logs them: the sampled action ids
    (here the action tokenised with a leading space, so they differ from re-tokenising) and
    prompts that append them verbatim (so trajectories stay packable), or with `rewrite` each
    prompt tokenised afresh (rewritten histories)."""
    out = []
    prev: dict[str, list[int]] = {}
    for row in rows:
        action_ids = tokenizer(" " + row["action"], add_special_tokens=False).input_ids
        obs_ids = tokenizer(row["messages"][-1]["content"] + "<|assistant|>", add_special_tokens=False).input_ids
        key = row["traj_id"]
        prompt_ids = (
            prev[key] if row["step_idx"] > 0 else tokenizer(row["messages"][0]["content"]).input_ids
        ) + obs_ids
        if rewrite:
            prompt_ids = tokenizer(row["prompt"], add_special_tokens=False).input_ids
        prev[key] = prompt_ids + action_ids
        out.append({**row, "prompt_token_ids": prompt_ids, "action_token_ids": action_ids})
    return out


def write_log(path: Path, rows: list[dict], drop: tuple[str, ...] = ()) -> Path:
    rows = [{k: v for k, v in r.items() if k not in drop} for r in rows]
    types = {
        "prompt": pa.large_string(),
        "action": pa.large_string(),
        "step_idx": pa.int32(),
        "prompt_token_ids": pa.list_(pa.int32()),
        "action_token_ids": pa.list_(pa.int32()),
    }
    names = list(rows[0])
    schema = pa.schema([(n, types[n]) if n in types else (n, pa.array([r[n] for r in rows]).type) for n in names])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is ~10× faster than two
    (threads wait on each other when another process holds a core) and just as exact."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- the slow twin

_LOADED: dict[str, tuple] = {}


def loaded(model_dir: Path) -> tuple:
    from gaca_cli.lm.models import load_causal_lm

    key = str(model_dir)
    if key not in _LOADED:
        _LOADED[key] = load_causal_lm(key, dtype="fp32", device="cpu")
    return _LOADED[key]


def reference_scores(
    model_dir: Path, rows: list[dict], source: str, temperature: float = 1.0, action_alone: bool = False
) -> list[tuple[float, int, list[float]]]:
    """(nll_sum, n_tokens, token log-probs) per row: one full forward per step."""
    import torch

    model, tok, _, _ = loaded(model_dir)
    out = []
    for row in rows:
        if source == "tokens":
            ctx, act = list(row["prompt_token_ids"]), list(row["action_token_ids"])
        else:
            text = (
                row["prompt"]
                if source == "prompt"
                else tok.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
            )
            ctx = tok(text, add_special_tokens=False).input_ids
            if action_alone:
                act = tok(row["action"], add_special_tokens=False).input_ids
            else:
                full = tok(text + row["action"], add_special_tokens=False).input_ids
                assert full[: len(ctx)] == ctx
                act = full[len(ctx) :]
        if not act:
            out.append((0.0, 0, []))
            continue
        with torch.no_grad():
            logits = model(torch.tensor([ctx + act])).logits[0].float() / temperature
        lp = torch.log_softmax(logits, dim=-1)[len(ctx) - 1 : -1].gather(1, torch.tensor(act)[:, None])[:, 0]
        out.append((-float(lp.double().sum()), len(act), lp.tolist()))
    return out


def by_key(table: pa.Table) -> dict[tuple[str, int], dict]:
    return {(r["traj_id"], r["step_idx"]): r for r in table.to_pylist()}


def assert_matches(table: pa.Table, rows: list[dict], ref: list, token_logprobs: bool = False) -> None:
    got = by_key(table)
    assert len(got) == len(rows)
    for row, (nll, n, lps) in zip(rows, ref):
        g = got[(row["traj_id"], row["step_idx"])]
        assert g[C.N_ACTION_TOKENS] == n
        assert abs(g[C.NLL_SUM] - nll) <= TOL, (row["traj_id"], row["step_idx"], g[C.NLL_SUM], nll)
        if n:
            assert abs(g[C.NLL_MEAN] - nll / n) <= TOL
        else:
            assert g[C.NLL_MEAN] is None and g[C.NLL_SUM] == 0.0
        if token_logprobs:
            np.testing.assert_allclose(g[C.TOKEN_LOGPROBS], lps, atol=TOL, rtol=0)


def score_lib(log_path: Path, model_dir: Path, out: Path, **options):
    """The library call, with the model already in memory."""
    from gaca_cli.lm.scoring import ScoreConfig, run_score
    from gaca_cli.log.reading import read_log

    column_map = options.pop("column_map", None)
    hooks = {k: options.pop(k) for k in ("on_chunk",) if k in options}
    config = ScoreConfig(model=str(model_dir), dtype="fp32", device="cpu", **options)
    return run_score(read_log([log_path], column_map), config, out, loaded=loaded(model_dir), **hooks)


# --------------------------------------------------------------------------- equality with the twin


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("source", ["prompt", "messages", "tokens"])
@pytest.mark.parametrize("rewrite", [False, True], ids=["append-only", "rewritten"])
def test_nll_equals_full_logits_reference(arch, source, rewrite, tiny_llama, tiny_gpt2, tmp_path):
    model_dir = tiny_llama if arch == "llama" else tiny_gpt2
    rows = make_rows(rewrite=rewrite, seed=len(arch) * 7 + len(source) * 3 + rewrite)
    if source == "tokens":
        rows = add_token_ids(rows, loaded(model_dir)[1], rewrite)
    drop = {"prompt": ("messages",), "messages": ("prompt",), "tokens": ()}[source]
    log = write_log(tmp_path / "log.parquet", rows, drop)
    ref = reference_scores(model_dir, rows, source)
    for budget in (1, 64, 100_000):  # every sequence alone .. everything in one batch
        run = score_lib(log, model_dir, tmp_path / f"out{budget}.parquet", max_batch_tokens=budget, token_logprobs=True)
        assert_matches(run.table, rows, ref, token_logprobs=True)
        s = run.summary
        n_traj = len({r["traj_id"] for r in rows})
        assert s["packed_trajectories"] == (0 if rewrite else n_traj)
        assert s["duplicate_sequences"] >= (1 if not rewrite else 4)  # the repeated trajectory
        assert s["context_sources"][{"tokens": "token_ids"}.get(source, source)] == len(rows)
    unpacked = score_lib(log, model_dir, tmp_path / "nopack.parquet", pack=False)
    assert unpacked.summary["packed_trajectories"] == 0
    assert_matches(unpacked.table, rows, ref)


def test_temperature_divides_logits(tiny_llama, tmp_path):
    rows = make_rows(groups=1, trajs=2, steps=3, seed=5)
    log = write_log(tmp_path / "log.parquet", rows)
    run = score_lib(log, tiny_llama, tmp_path / "out.parquet", temperature=0.7, context="prompt")
    assert_matches(run.table, rows, reference_scores(tiny_llama, rows, "prompt", temperature=0.7))
    meta = json.loads(pq.read_schema(tmp_path / "out.parquet").metadata[C.META_SCORE.encode()])
    assert meta["temperature"] == 0.7 and meta["dtype"] == "fp32" and meta["model"] == str(tiny_llama)


def test_a_temperature_that_overflows_the_logits_is_one_error_line(tiny_llama, tmp_path):
    """-T 1e-40 divides float32 logits into ±inf: NaN NLLs are refused, naming the rows, and
    nothing is written (not OUT, not its chunks), with no numpy warning on the way."""
    rows = make_rows(groups=1, trajs=2, steps=3, seed=5)
    log = write_log(tmp_path / "log.parquet", rows)
    out = tmp_path / "out.parquet"
    result = runner.invoke(app, ["score", str(log), "--model", str(tiny_llama), "-T", "1e-40", "-o", str(out)])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: {tiny_llama}: the model gives a non-finite NLL (-T 1e-40 divides the logits")
    assert "(g0/r0, 0)" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.parquet"]


def test_model_own_forward_path_agrees(tiny_gpt2, tmp_path, monkeypatch):
    """The fallback for models whose logits are not just W·h (soft-capping, scaling)."""
    from gaca_cli.lm.scoring import Scorer

    monkeypatch.setattr(Scorer, "_probe", lambda self: False)
    rows = make_rows(groups=1, trajs=2, steps=3, seed=6)
    log = write_log(tmp_path / "log.parquet", rows)
    run = score_lib(log, tiny_gpt2, tmp_path / "out.parquet")
    assert run.summary["fast_head"] is False
    assert_matches(run.table, rows, reference_scores(tiny_gpt2, rows, "prompt"))


def test_out_of_memory_backs_off(tiny_llama, tmp_path, monkeypatch):
    """A batch of several sequences, or a packed sequence, that 'does not fit' is split."""
    import torch

    from gaca_cli.lm.scoring import Scorer

    original = Scorer.logprobs

    def small_memory(self, seqs, spans):
        if len(seqs) > 1 or len(spans[0]) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(self, seqs, spans)

    monkeypatch.setattr(Scorer, "logprobs", small_memory)
    rows = make_rows(groups=1, trajs=2, steps=3, seed=7)
    log = write_log(tmp_path / "log.parquet", rows)
    run = score_lib(log, tiny_llama, tmp_path / "out.parquet", max_batch_tokens=100_000)
    assert run.summary["oom_backoffs"] > 0
    assert_matches(run.table, rows, reference_scores(tiny_llama, rows, "prompt"))


# --------------------------------------------------------------------------- tokenisation rules


def test_empty_action_and_prefix_mismatch(tiny_llama, tmp_path):
    """An empty action: nll_sum 0, no tokens, null mean. A context ending in 'take k' before
    the action 'ey' breaks the prefix rule (BPE merges ' key'): counted, reported, and
    scored as the action tokenised on its own after the context's tokens."""
    rows = make_rows(groups=1, trajs=2, steps=2, rewrite=True, duplicate=False, seed=8)
    rows[0]["action"] = ""
    rows[1]["prompt"] = rows[1]["prompt"] + "take k"
    rows[1]["action"] = "ey"
    log = write_log(tmp_path / "log.parquet", rows, ("messages",))
    _, tok, _, _ = loaded(tiny_llama)
    ctx = tok(rows[1]["prompt"]).input_ids
    assert tok(rows[1]["prompt"] + "ey").input_ids[: len(ctx)] != ctx
    run = score_lib(log, tiny_llama, tmp_path / "out.parquet")
    ref = (
        reference_scores(tiny_llama, rows[:1], "prompt")
        + reference_scores(tiny_llama, rows[1:2], "prompt", action_alone=True)
        + reference_scores(tiny_llama, rows[2:], "prompt")
    )
    assert_matches(run.table, rows, ref)
    assert run.summary["empty_actions"] == 1
    assert run.summary["prefix_mismatch_rows"] == 1
    assert run.summary["prefix_mismatch_examples"] == ["(g0/r0, 1)"]

    result = runner.invoke(
        app,
        [
            "score",
            str(log),
            "--model",
            str(tiny_llama),
            "-o",
            str(tmp_path / "strict.parquet"),
            "--strict-prefix",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 1
    assert "not a prefix" in result.stderr and "(g0/r0, 1)" in result.stderr
    assert not (tmp_path / "strict.parquet").exists()


@pytest.mark.parametrize("column", ["prompt", "prompt_token_ids"])
def test_an_empty_context_names_the_column_it_came_from(tiny_llama, tmp_path, column):
    """A step whose context has no tokens before a non-empty action: one error naming the
    column the context was read from (and the BOS hint only where it can help: text)."""
    rows = make_rows(groups=1, trajs=2, steps=2, duplicate=False, seed=9)
    _, tok, _, _ = loaded(tiny_llama)
    if column == "prompt_token_ids":
        rows = add_token_ids(rows, tok)
        rows[1]["prompt_token_ids"] = []
    else:
        rows[1]["prompt"] = ""
    log = write_log(tmp_path / "log.parquet", rows, ("messages",))
    out = tmp_path / "out.parquet"
    res = runner.invoke(app, ["score", str(log), "--model", str(tiny_llama), "--no-pack", "-o", str(out)])
    assert res.exit_code == 1, res.output
    (line,) = res.stderr.strip().splitlines()
    assert f"column '{column}': the context has no tokens" in line and "(g0/r0, 1)" in line, line
    assert ("--add-special-tokens" in line) is (column == "prompt") and not out.exists()


def test_rerun_replaces_own_columns_and_keeps_the_rest(tiny_llama, tmp_path):
    rows = make_rows(groups=1, trajs=2, steps=2, seed=9)
    log = write_log(tmp_path / "log.parquet", rows, ("messages",))
    table = pq.read_table(log)
    table = table.replace_schema_metadata({C.META_ADVANTAGES: '{"method": "grpo"}', "other": "x"})
    pq.write_table(table, log)
    first = tmp_path / "once.parquet"
    second = tmp_path / "twice.parquet"
    args = ["--model", str(tiny_llama), "--token-logprobs", "--device", "cpu"]
    assert runner.invoke(app, ["score", str(log), "-o", str(first), *args]).exit_code == 0
    assert (
        runner.invoke(
            app, ["score", str(first), "-o", str(second), "--model", str(tiny_llama), "-T", "2", "--device", "cpu"]
        ).exit_code
        == 0
    )
    once, twice = pq.read_table(first), pq.read_table(second)
    inputs = pq.read_table(log).column_names
    assert twice.column_names == inputs + [C.NLL_SUM, C.NLL_MEAN, C.N_ACTION_TOKENS]  # token_logprobs gone: stale
    assert twice.select(inputs).equals(pq.read_table(log).select(inputs))
    assert not twice.column(C.NLL_SUM).equals(once.column(C.NLL_SUM))  # rescored at T = 2
    meta = pq.read_schema(second).metadata
    assert meta[C.META_ADVANTAGES.encode()] == b'{"method": "grpo"}'
    assert json.loads(meta[C.META_SCORE.encode()])["temperature"] == 2.0


def test_column_map(tiny_gpt2, tmp_path):
    rows = make_rows(groups=1, trajs=2, steps=2, seed=10)
    renamed = [
        {("text_in" if k == "prompt" else "reply" if k == "action" else k): v for k, v in r.items()} for r in rows
    ]
    log = write_log(tmp_path / "log.parquet", renamed, ("messages",))
    out = tmp_path / "out.parquet"
    result = runner.invoke(
        app,
        [
            "score",
            str(log),
            "--model",
            str(tiny_gpt2),
            "-o",
            str(out),
            "--json",
            "--map",
            "prompt=text_in",
            "--map",
            "action=reply",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == len(rows)
    table = pq.read_table(out)
    assert "text_in" in table.column_names and "prompt" not in table.column_names
    assert_matches(table, rows, reference_scores(tiny_gpt2, rows, "prompt"))


# --------------------------------------------------------------------------- interruption


def test_resume_after_interruption_gives_the_same_file(tiny_llama, tmp_path):
    """Interrupt after the first chunk (as Ctrl-C would), then finish with --resume: the
    file equals an uninterrupted run's, and the finished chunk is not scored again."""
    rows = make_rows(groups=3, trajs=3, steps=3, seed=11)
    log = write_log(tmp_path / "log.parquet", rows)
    whole = tmp_path / "whole.parquet"
    common = [
        "--model",
        str(tiny_llama),
        "--chunk-rows",
        "9",
        "--max-batch-tokens",
        "300",
        "--token-logprobs",
        "--device",
        "cpu",
    ]
    assert runner.invoke(app, ["score", str(log), "-o", str(whole), *common]).exit_code == 0

    out = tmp_path / "resumed.parquet"

    def interrupt(k: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score_lib(log, tiny_llama, out, chunk_rows=9, max_batch_tokens=300, token_logprobs=True, on_chunk=interrupt)
    assert not out.exists()
    parts = tmp_path / "resumed.parquet.parts"
    assert len(list(parts.glob("*.chunk*.parquet"))) == 1

    again = runner.invoke(app, ["score", str(log), "-o", str(out), *common])
    assert again.exit_code == 1 and "--resume" in again.stderr and not out.exists()
    other = runner.invoke(app, ["score", str(log), "-o", str(out), *common, "--resume", "-T", "2"])
    assert other.exit_code == 1 and "temperature" in other.stderr and not out.exists()

    result = runner.invoke(app, ["score", str(log), "-o", str(out), *common, "--resume", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["resumed_chunks"] == 1 and summary["chunks"] == 3
    assert pq.read_table(out).equals(pq.read_table(whole))
    assert pq.read_schema(out).metadata == pq.read_schema(whole).metadata
    assert not parts.exists()


def test_a_sequence_too_big_for_the_device_keeps_the_chunks(tiny_llama, tmp_path, monkeypatch):
    """Out of memory for a single sequence (after the first chunk): one error, and the chunk
    scored before it stays in OUT.parts (not a data problem: resumable, on another device,
    say); --resume then gives the uninterrupted run's file."""
    import torch

    from gaca_cli.errors import GacaError
    from gaca_cli.lm.scoring import Scorer

    rows = make_rows(groups=3, trajs=3, steps=3, seed=11)
    log = write_log(tmp_path / "log.parquet", rows)
    common = ["--model", str(tiny_llama), "--chunk-rows", "9", "--device", "cpu", "--dtype", "fp32"]
    whole = tmp_path / "whole.parquet"
    assert runner.invoke(app, ["score", str(log), "-o", str(whole), *common]).exit_code == 0

    full = {"memory": False}
    original = Scorer.logprobs

    def after_first_chunk(self, seqs, spans):
        if full["memory"]:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return original(self, seqs, spans)

    def fill(k: int) -> None:
        full["memory"] = True

    monkeypatch.setattr(Scorer, "logprobs", after_first_chunk)
    out = tmp_path / "out.parquet"
    with pytest.raises(GacaError, match="single sequence.*chunks scored so far are kept"):
        score_lib(log, tiny_llama, out, chunk_rows=9, on_chunk=fill)
    parts = tmp_path / "out.parquet.parts"
    assert not out.exists() and len(list(parts.glob("*.chunk*.parquet"))) == 1
    monkeypatch.setattr(Scorer, "logprobs", original)
    result = runner.invoke(app, ["score", str(log), "-o", str(out), *common, "--resume", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["resumed_chunks"] == 1
    assert pq.read_table(out).equals(pq.read_table(whole))


def test_resume_refuses_an_input_edited_in_place_and_a_replaced_model(tiny_llama, tmp_path):
    """The resume fingerprint holds the inputs' bytes and the model's files: a log rewritten with
    the same size and its mtime restored, and other weights at the same model path, are refused."""
    import os
    import shutil

    from tests.lm.tiny_models import build_model

    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    rows = make_rows(groups=3, trajs=3, steps=3, seed=12)
    log = write_log(tmp_path / "log.parquet", rows)
    out = tmp_path / "out.parquet"
    common = ["--model", str(model), "--chunk-rows", "9", "--device", "cpu", "-o", str(out)]

    def interrupt(k: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score_lib(log, model, out, chunk_rows=9, on_chunk=interrupt)

    original, stat = log.read_bytes(), log.stat()
    edited = [dict(r, reward=r["reward"] + 1.0) for r in rows]  # same types, same encoded size
    write_log(log, edited)
    assert log.stat().st_size == stat.st_size and log.read_bytes() != original
    os.utime(log, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    res = runner.invoke(app, ["score", str(log), *common, "--resume"])
    assert res.exit_code == 1 and "differing: files" in res.stderr and not out.exists(), res.output

    log.write_bytes(original)
    shutil.rmtree(model)
    build_model(model, arch="llama", seed=1)
    res = runner.invoke(app, ["score", str(log), *common, "--resume"])
    assert res.exit_code == 1 and "differing: model_files" in res.stderr and not out.exists(), res.output

    shutil.rmtree(model)
    shutil.copytree(tiny_llama, model)
    res = runner.invoke(app, ["score", str(log), *common, "--resume", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["resumed_chunks"] == 1


# --------------------------------------------------------------------------- errors


def _assert_error(result, out: Path, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for needle in needles:
        assert needle in lines[0]
    assert not out.exists()
    assert not out.with_name(out.name + ".parts").exists()


def test_bad_model_paths(tiny_llama, tmp_path):
    rows = make_rows(groups=1, trajs=2, steps=2, seed=12)
    log = write_log(tmp_path / "log.parquet", rows)
    out = tmp_path / "out.parquet"
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    for model, needle in [
        (tmp_path / "missing", "no such model directory"),
        (empty, "config.json"),
        (log, "not a file"),
    ]:
        _assert_error(runner.invoke(app, ["score", str(log), "--model", str(model), "-o", str(out)]), out, needle)
    import torch

    if not torch.cuda.is_available():
        _assert_error(
            runner.invoke(app, ["score", str(log), "--model", str(tiny_llama), "-o", str(out), "--device", "cuda"]),
            out,
            "no CUDA device",
        )


def test_bad_logs(tiny_llama, tmp_path):
    from tests.lm.tiny_models import build_model

    out = tmp_path / "out.parquet"
    rows = make_rows(groups=1, trajs=2, steps=2, seed=13)
    no_text = write_log(tmp_path / "no_text.parquet", rows, ("prompt", "messages"))
    _assert_error(
        runner.invoke(app, ["score", str(no_text), "--model", str(tiny_llama), "-o", str(out)]), out, "'prompt'"
    )
    dup = write_log(tmp_path / "dup.parquet", rows + rows[:1])
    _assert_error(runner.invoke(app, ["score", str(dup), "--model", str(tiny_llama), "-o", str(out)]), out, "unique")
    bad_ids = add_token_ids(rows, loaded(tiny_llama)[1])
    bad_ids[1]["action_token_ids"] = [5, 10_000]
    bad = write_log(tmp_path / "bad_ids.parquet", bad_ids)
    _assert_error(
        runner.invoke(app, ["score", str(bad), "--model", str(tiny_llama), "-o", str(out)]),
        out,
        "vocabulary",
        "(g0/r0, 1)",
        "column 'action_token_ids'",  # the column holding the bad id
    )
    messages_only = write_log(tmp_path / "messages.parquet", rows, ("prompt",))
    no_template = build_model(tmp_path / "no-template", arch="llama", chat_template=False)
    _assert_error(
        runner.invoke(app, ["score", str(messages_only), "--model", str(no_template), "-o", str(out)]),
        out,
        "chat template",
    )
    usage = runner.invoke(app, ["score", str(messages_only), "--model", str(tiny_llama), "-o", str(out), "-T", "0"])
    assert usage.exit_code == 2 and not out.exists()


def test_steps_longer_than_learned_positions_are_one_error(tmp_path):
    """A GPT-2 (learned position embeddings) of 64 positions and a step of ~100 tokens: one
    error naming the prompt column, the rows and the limit, and no work directory left, where
    the forward failed with an IndexError (a device-side assert on a GPU). The same log scores
    on a rotary model of 64 positions (no hard limit)."""
    from tests.lm.tiny_models import build_model

    short = build_model(tmp_path / "gpt2-64", arch="gpt2", n_positions=64)
    rope = build_model(tmp_path / "llama-64", arch="llama", max_position_embeddings=64)
    rows = make_rows(groups=1, trajs=2, steps=2, seed=14, duplicate=False)
    rows[3]["prompt"] += " and then" * 40
    log = write_log(tmp_path / "long.parquet", rows, ("messages",))
    out = tmp_path / "out.parquet"
    result = runner.invoke(app, ["score", str(log), "--model", str(short), "-o", str(out)])
    _assert_error(result, out, "column 'prompt'", "(g0/r1, 1)", "longer than the 64 positions")
    assert runner.invoke(app, ["score", str(log), "--model", str(rope), "-o", str(out)]).exit_code == 0


def test_help_has_an_example():
    result = runner.invoke(app, ["score", "--help"])
    assert result.exit_code == 0 and "Example: gaca score" in result.output


@pytest.mark.parametrize("after_chunks", [1, 0])
def test_ctrl_c_says_how_to_resume(tiny_llama, tmp_path, monkeypatch, after_chunks):
    """Ctrl-C during `gaca score` exits 130 with one line saying where the finished chunks are
    and how to continue, and leaves no output file; before any chunk is finished there is
    nothing to continue: the work directory goes too, and the same command runs again."""
    import gaca_cli.lm.scoring as scoring

    real, real_plan = scoring.run_score, scoring.score_plan

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if after_chunks:  # once the first chunk is written
        monkeypatch.setattr(scoring, "run_score", lambda *a, **k: real(*a, **k, on_chunk=interrupt))
    else:  # while the first chunk is scored (its work directory and manifest written)
        monkeypatch.setattr(scoring, "score_plan", interrupt)
    log = write_log(tmp_path / "log.parquet", make_rows(groups=1, trajs=2, steps=2, seed=13))
    out = tmp_path / "out.parquet"
    args = ["score", str(log), "--model", str(tiny_llama), "--device", "cpu", "--chunk-rows", "2", "-o", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 130, res.output
    assert not out.exists()
    (line,) = res.stderr.strip().splitlines()[-1:]
    if after_chunks:
        assert line == (
            f"interrupted; finished chunks are kept in {out}.parts/: continue with the same command and --resume"
        )
    else:
        assert line == "interrupted; no chunk was finished, so nothing is kept"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["log.parquet"]
        monkeypatch.setattr(scoring, "score_plan", real_plan)
        assert runner.invoke(app, args).exit_code == 0
