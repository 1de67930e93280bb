"""`gaca train-offline` end to end on tiny local models (on the CPU), loaded by path as users do.

Log-probs are checked against a slow twin: one full forward per (context, action), a plain
log_softmax over every position and a gather, with the action's tokens = the tokens that
tokenising context + action adds after the context's tokens.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.log import columns as C

runner = CliRunner()

PROMPT = "<|user|>You are in the hall.\n<|assistant|>"
GOOD, BAD = "take key", "look around"
FAST = ["--warmup-ratio", "0", "--save-every", "0"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads; on a shared 2-core machine threads only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_log(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def two_action_rows(good_adv: float = 1.0, bad_adv: float = -1.0) -> list[dict]:
    """One prompt, two rollouts of one step: GOOD (A > 0) and BAD (A < 0)."""
    return [
        dict(group_id="g0", traj_id="t0", step_idx=0, reward=1.0, prompt=PROMPT, action=GOOD, advantage=good_adv),
        dict(group_id="g0", traj_id="t1", step_idx=0, reward=0.0, prompt=PROMPT, action=BAD, advantage=bad_adv),
    ]


def many_rows(n_traj: int = 6, n_steps: int = 3) -> list[dict]:
    actions = [GOOD, BAD, "go to hall", "open door with key"]
    rows = []
    for t in range(n_traj):
        for s in range(n_steps):
            rows.append(
                dict(
                    group_id=f"g{t // 3}",
                    traj_id=f"t{t}",
                    step_idx=s,
                    reward=float(s == n_steps - 1),
                    prompt=f"<|user|>You are in the corridor. {s}\n<|assistant|>",
                    action=actions[(t + s) % 4],
                    advantage=float((t * 5 + s * 3) % 7 - 3) / 2,
                )
            )
    return rows


def slow_action_logprob(model_dir: Path, context: str, action: str) -> float:
    """Σ log π(action tokens | context) with a full-logits forward (the slow twin)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    full = tok(context + action, add_special_tokens=False)["input_ids"]
    assert full[: len(ctx)] == ctx
    ids = torch.tensor([full])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
    return float(sum(logp[p - 1, full[p]] for p in range(len(ctx), len(full))))


def slow_token_logprobs(model, tok, context: str, action: str) -> torch.Tensor:
    """log π of each action token with a full-logits forward of one sequence (the slow twin)."""
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    full = tok(context + action, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits.float(), dim=-1)[0]
    return torch.stack([logp[p - 1, full[p]] for p in range(len(ctx), len(full))])


def run(args: list[str]):
    """`gaca train-offline ARGS`, on the CPU unless ARGS name a device (also on a machine with a
    GPU: these tests compare numbers at CPU precision; tests/lm/test_cuda.py trains on the GPU)."""
    args = [*map(str, args)]
    return runner.invoke(app, ["train-offline", *args, *([] if "--device" in args else ["--device", "cpu"])])


def load_state(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


# ------------------------------------------------------------------------------- behaviour


def test_one_step_changes_every_trainable_parameter(tiny_llama, tmp_path):
    """Full fine-tuning: after one AdamW step every parameter tensor of the saved model differs
    from the starting one; the output loads with plain transformers."""
    from transformers import AutoModelForCausalLM

    log = write_log(tmp_path / "log.parquet", many_rows())
    out = tmp_path / "out"
    res = run([log, "--model", tiny_llama, "--loss", "pg", "--max-steps", "1", "--lr", "1e-3", "-o", out, *FAST])
    assert res.exit_code == 0, res.output
    before, after = load_state(tiny_llama), load_state(out)
    assert before.keys() == after.keys()
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, unchanged
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1]
    for key in (
        "loss",
        "policy_loss",
        "kl",
        "ratio_mean",
        "ratio_max",
        "clip_frac",
        "ess",
        "grad_norm",
        "tokens_per_s",
        "lr",
    ):
        assert key in lines[0]
    assert lines[0]["lr"] == pytest.approx(1e-3) and lines[0]["grad_norm"] > 0


def fit_to_actions(model_dir: Path, out: Path, pairs: list[tuple[str, str]], steps: int = 40, lr: float = 1e-2) -> Path:
    """A plain-torch behaviour-cloning loop (independent of the tool): fit the model to the
    given (context, action) pairs so that it has generated them, as a logging policy would."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    batch = []
    for context, action in pairs:
        n_ctx = len(tok(context, add_special_tokens=False)["input_ids"])
        ids = tok(context + action, add_special_tokens=False)["input_ids"]
        labels = [-100] * n_ctx + ids[n_ctx:]
        batch.append((torch.tensor([ids]), torch.tensor([labels])))
    for _ in range(steps):
        opt.zero_grad()
        sum(model(input_ids=i, labels=lab).loss for i, lab in batch).backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def two_action_policy(tiny_llama, tmp_path_factory):
    """A starting policy that puts about half its mass on each of GOOD and BAD (it generated
    the log), and the two-action log scored by `gaca score --token-logprobs` with it."""
    root = tmp_path_factory.mktemp("two-action")
    start = fit_to_actions(tiny_llama, root / "start", [(PROMPT, GOOD), (PROMPT, BAD)])
    log = write_log(root / "log.parquet", two_action_rows())
    scored = root / "scored.parquet"
    res = runner.invoke(
        app, ["score", str(log), "--model", str(start), "--token-logprobs", "--device", "cpu", "-o", str(scored)]
    )
    assert res.exit_code == 0, res.output
    return start, scored


def test_token_logprobs_scored_at_another_temperature_are_a_warning(two_action_policy, tmp_path):
    """μ from `gaca score -T 0.5 --token-logprobs` with a run at -T 1: π/μ would compare two
    temperatures; the file's gaca.score metadata says so, and the same -T gives no warning."""
    start, scored = two_action_policy
    table = pq.read_table(scored)
    meta = dict(table.schema.metadata)
    score_meta = json.loads(meta[C.META_SCORE.encode()])
    meta[C.META_SCORE.encode()] = json.dumps({**score_meta, "temperature": 0.5}).encode()
    at_half = tmp_path / "scored-T0.5.parquet"
    pq.write_table(table.replace_schema_metadata(meta), at_half)
    warning = "token_logprobs were scored with -T 0.5 (gaca.score metadata), this run uses -T 1"
    for extra, warned in (((), True), (("-T", "0.5"), False)):
        out = tmp_path / f"out{len(extra)}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = run([at_half, "--model", start, "--max-steps", "1", "--batch-size", "2", "-o", out, *FAST, *extra])
        assert res.exit_code == 0, res.output
        assert any(warning in str(w.message) for w in caught) is warned, [str(w.message) for w in caught]


@pytest.mark.parametrize("loss", ["ppo", "pg", "awr", "filtered-bc"])
def test_each_loss_raises_the_good_action_and_lowers_the_bad(loss, two_action_policy, tmp_path):
    """One prompt, A = +1 on GOOD and A = −1 on BAD, from a policy that generated both (about
    half its mass on each): four steps raise log π(GOOD) and lower log π(BAD), measured with
    the slow twin. (From a random model AWR would raise both: it moves π towards
    μ·exp(A/τ)/Z, far above a random model's e^−30.) μ comes from `gaca score
    --token-logprobs`, so the first step's ratio is exactly 1 on every token: the tokens line up."""
    start, scored = two_action_policy
    out = tmp_path / loss
    res = run(
        [
            scored,
            "--model",
            start,
            "--loss",
            loss,
            "--max-steps",
            "4",
            "--lr",
            "3e-3",
            "--batch-size",
            "2",
            "-o",
            out,
            "--json",
            *FAST,
        ]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["behavior_source"] == "token_logprobs"
    good0, bad0 = (slow_action_logprob(start, PROMPT, a) for a in (GOOD, BAD))
    good1, bad1 = (slow_action_logprob(out, PROMPT, a) for a in (GOOD, BAD))
    assert good1 > good0 + 0.05, (good0, good1)
    assert bad1 < bad0 - 0.1, (bad0, bad1)
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    if loss == "ppo":
        assert first["clip_frac"] == 0.0


@pytest.mark.parametrize("loss", ["ppo", "pg"])
def test_zero_advantage_gives_zero_policy_gradient_through_the_model(loss, tiny_llama):
    """A = 0 on every token of a real forward: every parameter's gradient is exactly zero."""
    from gaca_cli.lm.losses import policy_token_loss, token_weights
    from gaca_cli.lm.models import load_causal_lm
    from gaca_cli.lm.policy import action_logprobs
    from gaca_cli.lm.train_config import TrainConfig

    model, tok, device, _ = load_causal_lm(str(tiny_llama), dtype="fp32", device="cpu")
    seqs = [np.asarray(tok(PROMPT + a)["input_ids"]) for a in (GOOD, BAD)]
    n_ctx = [len(tok(PROMPT)["input_ids"])] * 2
    logp = action_logprobs(model, seqs, n_ctx, 0, device)
    adv = torch.zeros_like(logp)
    config = TrainConfig(model="-", loss=loss, is_cap=2.0 if loss == "pg" else None)
    ell, _ = policy_token_loss(loss, logp, adv, logp.detach() - 0.3, config)
    n = len(logp)
    (token_weights(torch.zeros(n, dtype=torch.long), torch.tensor([n]), "token-mean", n, 1) * ell).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is None or torch.count_nonzero(g) == 0 for g in grads)
    assert any(g is not None for g in grads)


@pytest.mark.parametrize("keep_mode", ["mask", "positions", "full"])  # policy.KEEP_MODES
@pytest.mark.parametrize("arch_fixture", ["tiny_llama", "tiny_gpt2"])
def test_action_logprobs_match_the_slow_twin(arch_fixture, keep_mode, request):
    """Padded micro-batch + logits only at action positions == full-logits log_softmax + gather,
    whichever way the logits are asked for (`logits_keep_mode`)."""
    from gaca_cli.lm.models import load_causal_lm
    from gaca_cli.lm.policy import action_logprobs, logits_keep_mode

    model_dir = request.getfixturevalue(arch_fixture)
    model, tok, device, _ = load_causal_lm(str(model_dir), dtype="fp32", device="cpu")
    if keep_mode == "mask" and logits_keep_mode(model) != "mask":
        pytest.skip("this transformers version takes no boolean logits_to_keep mask")
    pairs = [
        (PROMPT, GOOD),
        ("<|user|>You are in the corridor. The garden door is locked.\n<|assistant|>", "open door with key"),
        ("<|user|>x\n<|assistant|>", BAD),
    ]
    seqs, n_ctx, want = [], [], []
    for c, a in pairs:
        ctx = tok(c)["input_ids"]
        full = tok(c + a)["input_ids"]
        seqs.append(np.asarray(full))
        n_ctx.append(len(ctx))
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits.float(), -1)[0]
        want.extend(float(lp[p - 1, full[p]]) for p in range(len(ctx), len(full)))
    with torch.no_grad():
        got = action_logprobs(model, seqs, n_ctx, 0, device, keep_mode=keep_mode)
    np.testing.assert_allclose(got.numpy(), np.asarray(want), atol=1e-5, rtol=0)


class OlderForward(torch.nn.Module):
    """A real tiny model behind the forward of older transformers: `logits_to_keep` indexes
    the positions axis (so a 2-D mask fails, "too many indices"), or with `keeps=False` is not
    an argument at all."""

    def __init__(self, inner, keeps: bool = True):
        super().__init__()
        self.inner, self.keeps = inner, keeps

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, use_cache=False, **kwargs):
        from types import SimpleNamespace

        if "logits_to_keep" in kwargs and not self.keeps:
            raise TypeError("forward() got an unexpected keyword argument 'logits_to_keep'")
        logits = self.inner(input_ids=input_ids, use_cache=use_cache).logits
        if "logits_to_keep" in kwargs:
            logits = logits[:, kwargs["logits_to_keep"], :]
        return SimpleNamespace(logits=logits)


def test_logits_keep_mode_follows_what_the_forward_takes(tiny_llama):
    """The probe picks the boolean mask where the forward takes it, positions where a 2-D
    tensor fails (transformers before the mask), and a full forward where there is no
    `logits_to_keep`; it leaves the model's train/eval mode as it found it."""
    from gaca_cli.lm.models import load_causal_lm
    from gaca_cli.lm.policy import kept_logits, logits_keep_mode

    model = load_causal_lm(str(tiny_llama), dtype="fp32", device="cpu")[0]
    model.train()
    assert logits_keep_mode(model) in ("mask", "positions")
    assert model.training
    assert logits_keep_mode(OlderForward(model)) == "positions"
    assert logits_keep_mode(OlderForward(model, keeps=False)) == "full"
    with pytest.raises(ValueError, match="keep mode"):
        kept_logits(model, torch.zeros((1, 2), dtype=torch.long), torch.ones((1, 2), dtype=torch.bool), "rows")


def test_micro_batching_does_not_change_the_step(tiny_llama, tmp_path):
    """A tiny token budget (many accumulated micro-batches) gives the same loss and gradient
    norm as one micro-batch per step: the token weights use the whole step's counts."""
    log = write_log(tmp_path / "log.parquet", many_rows())
    records = []
    for budget in ("100000", "40"):
        out = tmp_path / f"b{budget}"
        res = run(
            [
                log,
                "--model",
                tiny_llama,
                "--loss",
                "awr",
                "--aggregation",
                "seq-mean",
                "--max-steps",
                "2",
                "--batch-size",
                "9",
                "--max-batch-tokens",
                budget,
                "-o",
                out,
                *FAST,
            ]
        )
        assert res.exit_code == 0, res.output
        records.append([json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()])
    for a, b in zip(*records):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_micro_batching_does_not_change_the_weights_with_a_kl_penalty(tiny_llama, tmp_path):
    """With --kl-coef, π_ref is computed once in micro-batches of its own; at the first step
    π_θ is π_ref, so δ is exactly 0 there (not ~1e-7, which AdamW made a step of ~lr on
    weights whose true gradient is 0). Two token budgets end at the same weights, to rounding."""
    rows = many_rows()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    rng = np.random.default_rng(3)
    for r in rows:  # μ: any aligned per-token log-probs will do
        n = len(tok(r["prompt"] + r["action"])["input_ids"]) - len(tok(r["prompt"])["input_ids"])
        r["behavior_logprobs"] = (-rng.uniform(0.5, 3.0, size=n)).astype(np.float32).tolist()
    log = write_log(tmp_path / "log.parquet", rows)
    args = [log, "--model", tiny_llama, "--loss", "ppo", "--kl-coef", "0.5", "--max-steps", "3", "--batch-size", "4"]
    args += ["--lr", "3e-3", "--seed", "3", *FAST]
    states = []
    for budget in ("8192", "16"):
        assert run([*args, "--max-batch-tokens", budget, "-o", tmp_path / budget]).exit_code == 0
        states.append(load_state(tmp_path / budget))
    a, b = states
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4


def test_runs_in_one_process_choose_their_own_precision(tiny_llama, tmp_path):
    """accelerate keeps one state per process and refuses a second Accelerator with another
    mixed precision. Two runs in one process (bf16, then fp32, then bf16 again) each get the
    precision they ask for, and the fp32 run repeats an fp32 run made alone exactly."""
    log = write_log(tmp_path / "log.parquet", many_rows())
    args = [log, "--model", tiny_llama, "--loss", "pg", "--max-steps", "1", "--device", "cpu", "--json", *FAST]
    seen = []
    for i, dtype in enumerate(["bf16", "fp32", "bf16"]):
        res = run([*args, "--dtype", dtype, "-o", tmp_path / f"run{i}"])
        assert res.exit_code == 0, res.output
        seen.append(json.loads(res.stdout)["mixed_precision"])
    assert seen == ["bf16", "no", "bf16"]
    import os
    import subprocess
    import sys

    alone = subprocess.run(
        [
            sys.executable,
            "-m",
            "gaca_cli",
            "train-offline",
            *map(str, args),
            "--dtype",
            "fp32",
            "-o",
            str(tmp_path / "alone"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert alone.returncode == 0, alone.stderr
    a, b = load_state(tmp_path / "run1"), load_state(tmp_path / "alone")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_reproduces_the_uninterrupted_run(tiny_llama, tmp_path):
    """ppo with a KL penalty and seq-mean: a run interrupted after step 3 (checkpoint at 2) and
    resumed with --resume ends with the same parameters and metrics as an uninterrupted run."""
    from gaca_cli.lm.train_config import TrainConfig

    rows = many_rows()
    rng = np.random.default_rng(0)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    for r in rows:  # μ: any aligned per-token log-probs will do here
        n = len(tok(r["prompt"] + r["action"])["input_ids"]) - len(tok(r["prompt"])["input_ids"])
        r["behavior_logprobs"] = (-rng.uniform(0.5, 6.0, size=n)).astype(np.float32).tolist()
    log = write_log(tmp_path / "log.parquet", rows)
    args = [
        "--model",
        tiny_llama,
        "--loss",
        "ppo",
        "--kl-coef",
        "0.1",
        "--aggregation",
        "seq-mean",
        "--max-steps",
        "5",
        "--batch-size",
        "6",
        "--lr",
        "3e-3",
        "--save-every",
        "2",
        "--warmup-ratio",
        "0.2",
    ]
    full = tmp_path / "full"
    res = run([log, *args, "-o", full])
    assert res.exit_code == 0, res.output

    config = TrainConfig(
        model=str(tiny_llama),
        loss="ppo",
        kl_coef=0.1,
        aggregation="seq-mean",
        max_steps=5,
        batch_size=6,
        lr=3e-3,
        save_every=2,
        warmup_ratio=0.2,
        device="cpu",
    )
    part = tmp_path / "part"
    interrupted_after_step(log, config, part, step=3)
    assert not (part / "model.safetensors").exists()
    res = run([log, *args, "-o", part, "--resume", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["resumed_from_step"] == 2

    a, b = load_state(full), load_state(part)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)
    ma = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in mb] == [1, 2, 3, 4, 5]
    for x, y in zip(ma, mb):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5, abs=1e-7)
    assert ma[0]["kl"] == pytest.approx(0.0, abs=1e-7) and ma[-1]["kl"] > 0


def interrupted_after_step(log: Path, config, out: Path, step: int = 2) -> None:
    """A run of `config` on `log` into `out`, interrupted (as Ctrl-C would) after `step`."""
    from gaca_cli.lm.training import train
    from gaca_cli.log.reading import read_log

    def interrupt(kind, info):
        if kind == "step" and info["step"] == step:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(read_log([log]), config, out, on_event=interrupt)


def test_resume_before_the_first_checkpoint_checks_the_run_and_starts_it_again(tiny_llama, tmp_path):
    """A run stopped after step 1, before its first checkpoint (step 2): --resume refuses other
    options or another log as it does after a checkpoint, and with the same ones runs from
    step 0 to the uninterrupted run's parameters and metrics."""
    from gaca_cli.lm.train_config import TrainConfig

    log = write_log(tmp_path / "log.parquet", many_rows())
    other = write_log(tmp_path / "other.parquet", many_rows(n_traj=3))
    args = ["--model", tiny_llama, "--loss", "pg", "--max-steps", "3", "--batch-size", "6", "--save-every", "2"]
    full = tmp_path / "full"
    assert run([log, *args, "-o", full]).exit_code == 0
    config = TrainConfig(model=str(tiny_llama), loss="pg", max_steps=3, batch_size=6, save_every=2, device="cpu")
    part = tmp_path / "part"
    interrupted_after_step(log, config, part, step=1)
    assert (part / "metrics.jsonl").exists() and not list((part / "checkpoints").glob("step-*"))
    res = run([log, *args, "--lr", "2e-5", "--resume", "-o", part])
    _assert_failed_cleanly(res, part / "model.safetensors", "started.json", "lr = 1e-05, now 2e-05")
    res = run([other, *args, "--resume", "-o", part])
    _assert_failed_cleanly(res, part / "model.safetensors", "the training data differ")
    res = run([log, *args, "--resume", "--json", "-o", part])
    assert res.exit_code == 0, res.output
    a, b = load_state(full), load_state(part)
    assert all(a[k].equal(b[k]) for k in a)
    steps = [json.loads(x)["step"] for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_resume_ignores_an_option_that_does_nothing_in_the_run(tiny_llama, tmp_path):
    """A run started (by an earlier gaca, which allowed it) with --loss pg --clip-high 0.28: the
    clip did nothing, so --resume without it (as the usage error now asks) continues the run."""
    import dataclasses

    from gaca_cli.lm.train_config import TrainConfig

    log = write_log(tmp_path / "log.parquet", many_rows())
    config = TrainConfig(model=str(tiny_llama), loss="pg", max_steps=3, batch_size=6, save_every=0, device="cpu")
    part = tmp_path / "part"
    interrupted_after_step(log, dataclasses.replace(config, clip_high=0.28), part, step=1)
    started = json.loads((part / "checkpoints" / "started.json").read_text())
    started["config"]["clip_high"] = 0.28  # as the earlier gaca recorded it
    (part / "checkpoints" / "started.json").write_text(json.dumps(started))
    args = [log, "--model", tiny_llama, "--loss", "pg", "--max-steps", "3", "--batch-size", "6", "--save-every", "0"]
    assert run([*args, "--clip-high", "0.28", "--resume", "-o", part]).exit_code == 2  # refused: drop it
    res = run([*args, "--resume", "-o", part])
    assert res.exit_code == 0, res.output


def test_resume_of_a_run_that_never_started_starts_it(tiny_llama, tmp_path):
    """--resume where OUT_DIR is missing or empty (a run stopped before it wrote anything, as
    its Ctrl-C message suggests) starts the run; a directory of other files is refused."""
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    args = [log, "--model", tiny_llama, "--loss", "pg", "--max-steps", "1", *FAST, "--resume"]
    res = run([*args, "-o", tmp_path / "new"])
    assert res.exit_code == 0 and (tmp_path / "new" / "model.safetensors").exists(), res.output
    (tmp_path / "empty").mkdir()
    assert run([*args, "-o", tmp_path / "empty"]).exit_code == 0
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    res = run([*args, "-o", tmp_path / "busy"])
    assert res.exit_code == 2 and "no training run" in res.stderr
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]


def test_resume_of_a_finished_run_trains_nothing_again(tiny_llama, tmp_path):
    """A job scheduler passing --resume to a finished job: the run's model, metrics and
    checkpoints stay as they are (the last steps used to be trained again, the model
    rewritten), and other options are still refused."""
    log = write_log(tmp_path / "log.parquet", many_rows())
    out = tmp_path / "out"
    args = [log, "--model", tiny_llama, "--loss", "pg", "--batch-size", "6", "--max-steps", "3", "--warmup-ratio", "0"]
    args += ["--save-every", "1", "-o", out]
    assert run(args).exit_code == 0
    files = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    res = run([*args, "--resume", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["already_finished"] is True and summary["steps"] == 3
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()} == files
    assert "nothing was trained again" in " ".join(run([*args, "--resume"]).stderr.split())  # the summary: stderr
    res = run([*args[:-2], "--lr", "1e-3", "-o", out, "--resume"])
    assert res.exit_code == 1 and "--resume: the run was started with lr" in res.stderr


def test_resume_takes_the_same_device_under_another_name(tiny_llama, tmp_path):
    """A run started with --device auto resumes with --device cpu where auto means the CPU (no
    GPU), and is refused where auto meant a GPU; another option still refuses the resume."""
    from gaca_cli.lm.train_config import TrainConfig

    log = write_log(tmp_path / "log.parquet", many_rows())
    config = TrainConfig(model=str(tiny_llama), loss="pg", max_steps=3, batch_size=6, save_every=1, device="auto")

    interrupted_after_step(log, config, tmp_path / "run")
    args = [
        log,
        "--model",
        tiny_llama,
        "--loss",
        "pg",
        "--max-steps",
        "3",
        "--batch-size",
        "6",
        "--save-every",
        "1",
        "--resume",
        "-o",
        tmp_path / "run",
    ]
    other = run([*args, "--lr", "1e-3", "--device", "cpu"])
    assert other.exit_code == 1 and "lr" in other.stderr
    res = run([*args, "--device", "cpu", "--json"])
    if torch.cuda.is_available():
        assert res.exit_code == 1 and "device = 'auto', now 'cpu'" in res.stderr
    else:
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["resumed_from_step"] == 2


def test_resume_refuses_changed_behavior_logprobs_and_a_replaced_model(tiny_llama, tmp_path):
    """The resume fingerprint covers what the numbers depend on: a log whose behaviour
    log-probs changed (same size, same everything else) and a starting model whose weights were
    replaced at the same path are refused with one Error line; the unchanged inputs resume."""
    from transformers import AutoTokenizer

    from gaca_cli.lm.train_config import TrainConfig
    from tests.lm.tiny_models import build_model

    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    tok = AutoTokenizer.from_pretrained(model)
    rows = many_rows()
    for r in rows:
        n = len(tok(r["prompt"] + r["action"])["input_ids"]) - len(tok(r["prompt"])["input_ids"])
        r["behavior_logprobs"] = [-1.0] * n
    log = write_log(tmp_path / "log.parquet", rows)
    config = TrainConfig(model=str(model), loss="ppo", max_steps=3, batch_size=6, save_every=1, device="cpu")

    interrupted_after_step(log, config, tmp_path / "run")
    args = ["--model", model, "--loss", "ppo", "--max-steps", "3", "--batch-size", "6", "--save-every", "1"]
    args += ["--device", "cpu", "--resume", "-o", tmp_path / "run"]

    changed = [dict(r, behavior_logprobs=[-2.0] * len(r["behavior_logprobs"])) for r in rows]
    res = run([write_log(tmp_path / "changed.parquet", changed), *args])
    assert res.exit_code == 1 and "training data differ" in res.stderr, res.output

    shutil.rmtree(model)
    build_model(model, arch="llama", seed=1)  # same shapes, same tokenizer, other weights
    res = run([log, *args])
    assert res.exit_code == 1 and "not the one the run started from" in res.stderr, res.output
    assert len([line for line in res.stderr.splitlines() if line.strip()]) == 1

    shutil.rmtree(model)
    shutil.copytree(tiny_llama, model)
    res = run([log, *args, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["resumed_from_step"] == 2


def test_lora_adapter_and_merge_load_with_plain_transformers(tiny_llama, tmp_path):
    """--lora-r: OUT_DIR is an adapter that AutoModelForCausalLM loads (peft installed);
    --merge: OUT_DIR holds merged weights and OUT_DIR/adapter the adapter, and both give the
    same logits."""
    from transformers import AutoModelForCausalLM

    log = write_log(tmp_path / "log.parquet", many_rows())
    lora_args = [
        "--model",
        tiny_llama,
        "--loss",
        "pg",
        "--lora-r",
        "4",
        "--lora-targets",
        "q_proj,v_proj",
        "--max-steps",
        "2",
        "--lr",
        "1e-2",
        *FAST,
    ]
    res = run([log, *lora_args, "-o", tmp_path / "lora"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "lora" / "adapter_config.json").exists()
    assert not (tmp_path / "lora" / "model.safetensors").exists()
    res = run([log, *lora_args, "--merge", "-o", tmp_path / "merged"])
    assert res.exit_code == 0, res.output

    ids = torch.tensor([[5, 17, 40, 99, 3]])
    base = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    adapter = AutoModelForCausalLM.from_pretrained(tmp_path / "lora").eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    merged_adapter = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "adapter").eval()
    with torch.no_grad():
        lb, la, lm, lma = (m(input_ids=ids).logits for m in (base, adapter, merged, merged_adapter))
    assert not torch.allclose(la, lb)  # the adapter changed the model
    torch.testing.assert_close(la, lm, rtol=0, atol=1e-5)  # same seed, same steps
    torch.testing.assert_close(lma, lm, rtol=0, atol=1e-5)


def test_a_lora_output_is_a_model_for_score_and_train_offline(tiny_llama, tmp_path):
    """A LoRA run's OUT_DIR (an adapter, no config.json) is a --model: gaca score reads it as
    the base with the adapter merged (the same numbers as the --merge output), and
    train-offline trains it in full; a new LoRA on top of it is refused, as it would name the
    base as its own and lose this adapter."""
    log = write_log(tmp_path / "log.parquet", many_rows())
    common = ["--loss", "awr", "--lora-r", "4", "--lr", "1e-2", "--max-steps", "2", "--batch-size", "6"]
    adapter, merged = tmp_path / "lora", tmp_path / "merged"
    assert run([log, "--model", tiny_llama, *common, "-o", adapter]).exit_code == 0
    assert run([log, "--model", tiny_llama, *common, "--merge", "-o", merged]).exit_code == 0
    assert (adapter / "adapter_config.json").exists() and not (adapter / "config.json").exists()
    scores = {}
    for name, model in (("adapter", adapter), ("merged", merged)):
        out = tmp_path / f"scored-{name}.parquet"
        res = runner.invoke(app, ["score", str(log), "--model", str(model), "-o", str(out), "--device", "cpu"])
        assert res.exit_code == 0 and "Warning" not in res.stderr, res.output
        scores[name] = pq.read_table(out)["nll_sum"].to_numpy()
    np.testing.assert_allclose(scores["adapter"], scores["merged"], rtol=0, atol=1e-6)
    full = tmp_path / "full"
    res = run([log, "--model", adapter, "--loss", "awr", "--max-steps", "1", "--batch-size", "6", "-o", full])
    assert res.exit_code == 0, res.output
    assert (full / "config.json").exists()
    res = run([log, "--model", adapter, *common, "-o", tmp_path / "again"])
    _assert_failed_cleanly(res, tmp_path / "again", "is a LoRA adapter", "--lora-r 0")


# ------------------------------------------------------------------------------- bad inputs


def _assert_failed_cleanly(res, out: Path, *needles: str, code: int = 1) -> None:
    assert res.exit_code == code, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    if code == 1:
        assert lines[-1].startswith("Error: "), res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr
    assert not out.exists()


def test_no_advantage_column(tiny_llama, tmp_path):
    rows = [{k: v for k, v in r.items() if k != "advantage"} for r in two_action_rows()]
    log = write_log(tmp_path / "log.parquet", rows)
    res = run([log, "--model", tiny_llama, "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "'advantage'", "gaca advantages")


def test_ppo_without_behavior_logprobs(tiny_llama, tmp_path):
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    res = run([log, "--model", tiny_llama, "--loss", "ppo", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "behavior_logprobs", "token_logprobs", "gaca score --token-logprobs")


def test_misaligned_behavior_logprobs(tiny_llama, tmp_path):
    rows = two_action_rows()
    for r in rows:
        r["behavior_logprobs"] = [-0.5] * len(r["action"].split())  # one per word, not per token
    log = write_log(tmp_path / "log.parquet", rows)
    res = run([log, "--model", tiny_llama, "--loss", "ppo", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "behavior_logprobs", "(t0, 0)")


def test_empty_log(tiny_llama, tmp_path):
    schema = pa.schema(
        [
            ("group_id", pa.string()),
            ("traj_id", pa.string()),
            ("step_idx", pa.int64()),
            ("reward", pa.float64()),
            ("prompt", pa.string()),
            ("action", pa.string()),
            ("advantage", pa.float64()),
        ]
    )
    log = tmp_path / "empty.parquet"
    pq.write_table(schema.empty_table(), log)
    res = run([log, "--model", tiny_llama, "--loss", "pg", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "no rows")


def test_all_zero_advantages(tiny_llama, tmp_path):
    log = write_log(tmp_path / "log.parquet", two_action_rows(0.0, 0.0))
    res = run([log, "--model", tiny_llama, "--loss", "pg", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "no step to train on", "A = 0")


def test_every_step_too_long_says_so(tiny_llama, tmp_path):
    """--max-length below every step: the error says the steps were skipped, not that A = 0."""
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    res = run([log, "--model", tiny_llama, "--loss", "pg", "--max-length", "3", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "every step with a gradient was skipped", "--max-length 3")
    assert "A = 0" not in res.stderr


def test_steps_longer_than_learned_positions(tmp_path):
    """A GPT-2 of 64 positions: steps longer than that are one error that names them and
    --max-length (the forward would fail with an IndexError); with --max-length 64 they are
    skipped and the rest trains."""
    from tests.lm.tiny_models import build_model

    short = build_model(tmp_path / "gpt2-64", arch="gpt2", n_positions=64)
    rows = two_action_rows()
    rows[1]["prompt"] = PROMPT + " and then" * 40
    log = write_log(tmp_path / "log.parquet", rows)
    res = run([log, "--model", short, "--loss", "pg", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "(t1, 0)", "64 positions", "--max-length 64")
    assert "(t0, 0)" not in res.stderr
    res = run([log, "--model", short, "--loss", "pg", "--max-length", "64", "-o", tmp_path / "out", "--json"])
    assert res.exit_code == 0, res.output


def test_lora_and_gradient_checkpointing_give_no_deprecation_warning(tiny_llama, tmp_path):
    """transformers 5.2x renamed gradient checkpointing to activation checkpointing and peft
    still asks the old name: neither warning is the user's to act on, so none is shown."""
    log = write_log(tmp_path / "log.parquet", many_rows())
    args = [log, "--model", tiny_llama, "--loss", "pg", "--max-steps", "1", "--batch-size", "6", *FAST]
    for i, extra in enumerate(
        (["--lora-r", "4"], ["--gradient-checkpointing"], ["--lora-r", "4", "--gradient-checkpointing"])
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert run([*args, *extra, "-o", tmp_path / f"out{i}"]).exit_code == 0
        assert not [str(w.message) for w in caught if "checkpointing" in str(w.message)], extra


def test_the_kl_reported_is_the_one_minimised_under_seq_mean(tiny_llama, tmp_path):
    """--aggregation seq-mean with --kl-coef: the KL in metrics.jsonl at step 2 is k3 averaged
    per step then over steps (as the objective weighs it), against the slow twin on the model
    after step 1 and the starting model; loss = policy loss + β·KL."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = many_rows()
    log = write_log(tmp_path / "log.parquet", rows)
    out = tmp_path / "out"
    args = [log, "--model", tiny_llama, "--loss", "pg", "--kl-coef", "0.5", "--aggregation", "seq-mean"]
    args += ["--max-steps", "2", "--batch-size", "100", "--lr", "1e-2", "--warmup-ratio", "0", "--save-every", "1"]
    assert run([*args, "-o", out]).exit_code == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    start = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    after_one = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    after_one.load_state_dict(load_file(out / "checkpoints" / "step-00000001" / "model.safetensors"), strict=False)
    per_step = []
    for r in rows:
        if r["advantage"] == 0:  # no policy loss: skipped, no KL either
            continue
        delta = slow_token_logprobs(start, tok, r["prompt"], r["action"]) - slow_token_logprobs(
            after_one, tok, r["prompt"], r["action"]
        )
        per_step.append(float((torch.exp(delta) - delta - 1).mean()))
    assert metrics[1]["kl"] == pytest.approx(np.mean(per_step), rel=1e-3) and metrics[1]["kl"] > 1e-4
    assert metrics[1]["loss"] == pytest.approx(metrics[1]["policy_loss"] + 0.5 * metrics[1]["kl"], rel=1e-9)


def test_a_diverging_run_stops_and_saves_no_model(tiny_llama, tmp_path):
    """An absurd learning rate without gradient clipping: the weights overflow and the next
    gradient is NaN. The run stops with one error naming the step, exit 1, and saves no model
    (a NaN model used to be saved with exit 0); the metrics of the steps before stay."""
    log = write_log(tmp_path / "log.parquet", many_rows())
    out = tmp_path / "out"
    args = [log, "--model", tiny_llama, "--loss", "awr", "--lr", "1e30", "--max-grad-norm", "0", "-o", out]
    res = run([*args, "--batch-size", "6", "--max-steps", "6"])
    assert res.exit_code == 1, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "training diverged at step" in lines[0] and "--lr" in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not list(out.glob("*.safetensors")) and not (out / "adapter_model.safetensors").exists()
    assert (out / "metrics.jsonl").exists()


def test_a_loss_that_is_not_finite_at_the_first_step_names_the_advantages_and_leaves_nothing(tiny_llama, tmp_path):
    """An advantage of 1e30 (finite) overflows the loss before any update: the error points at
    the advantages (not at --lr, which has not acted yet) and at -T when it is not 1, and the
    run leaves nothing behind, so the fixed command runs again without --resume."""
    rows = many_rows()
    for row in rows:
        row["advantage"] = 1e30 if row["advantage"] > 0 else row["advantage"]
    log = write_log(tmp_path / "log.parquet", rows)
    out = tmp_path / "runs" / "out"
    for extra, suspect in (((), "largest |A| is 1e+30)"), (("-T", "0.5"), "largest |A| is 1e+30) and -T 0.5")):
        res = run(
            [log, "--model", tiny_llama, "--loss", "pg", "--batch-size", "6", "--max-steps", "2", "-o", out, *extra]
        )
        assert res.exit_code == 1, res.output
        (line,) = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert "diverged at step 1" in line and "before any update: check the advantage column" in line, line
        assert line.endswith(suspect) and "--lr" not in line, line
        assert not (tmp_path / "runs").exists()


def test_bad_model_path(tmp_path):
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    res = run([log, "--model", tmp_path / "nope", "--loss", "pg", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "nope")


def test_unknown_lora_target(tiny_llama, tmp_path):
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    res = run(
        [
            log,
            "--model",
            tiny_llama,
            "--loss",
            "pg",
            "--lora-r",
            "4",
            "--lora-targets",
            "nope_proj",
            "-o",
            tmp_path / "out",
        ]
    )
    _assert_failed_cleanly(res, tmp_path / "out", "--lora-targets nope_proj")


def test_device_choices(tiny_llama, tmp_path):
    """--device: a spelling outside auto | cpu | cuda | cuda:N is a usage error (exit 2); a GPU
    that is not there is one Error line (exit 1) before anything is written. (tests/lm/test_cuda.py
    trains on a GPU where there is one.)"""
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    for bad in ("mps", "gpu", "cuda:", "cuda:x"):
        res = run([log, "--model", tiny_llama, "--loss", "pg", "--device", bad, "-o", tmp_path / "out"])
        _assert_failed_cleanly(res, tmp_path / "out", f"device = '{bad}'", "cuda:N", code=2)
    if not torch.cuda.is_available():
        res = run([log, "--model", tiny_llama, "--loss", "pg", "--device", "cuda", "-o", tmp_path / "out"])
        _assert_failed_cleanly(res, tmp_path / "out", "--device cuda", "no CUDA device")
    else:
        n = torch.cuda.device_count()
        res = run([log, "--model", tiny_llama, "--loss", "pg", "--device", f"cuda:{n}", "-o", tmp_path / "out"])
        _assert_failed_cleanly(res, tmp_path / "out", f"--device cuda:{n}", "CUDA device(s)")


def test_usage_errors_exit_2(tiny_llama, tmp_path):
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    res = run([log, "--model", tiny_llama, "--lr", "-1", "-o", tmp_path / "out"])
    _assert_failed_cleanly(res, tmp_path / "out", "lr = -1.0", code=2)
    busy = tmp_path / "busy"
    (busy / "checkpoints").mkdir(parents=True)
    res = run([log, "--model", tiny_llama, "--loss", "pg", "-o", busy])
    assert res.exit_code == 2 and "--resume" in res.stderr


@pytest.mark.slow
def test_two_processes_match_one(tiny_llama, tmp_path):
    """torchrun --nproc-per-node 2 (gloo, CPU) gives the same parameters and metrics as one
    process: every process builds the same batches and the token weights use global counts.
    Slow (two fresh interpreters): run with `pytest -m slow`."""
    import os
    import subprocess
    import sys

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    rng = np.random.default_rng(1)
    rows = many_rows()
    for r in rows:
        n = len(tok(r["prompt"] + r["action"])["input_ids"]) - len(tok(r["prompt"])["input_ids"])
        r["behavior_logprobs"] = (-rng.uniform(0.5, 6.0, size=n)).astype(np.float32).tolist()
    log = write_log(tmp_path / "log.parquet", rows)
    args = [
        "train-offline",
        str(log),
        "--model",
        str(tiny_llama),
        "--loss",
        "ppo",
        "--kl-coef",
        "0.1",
        "--max-steps",
        "3",
        "--batch-size",
        "5",
        "--max-batch-tokens",
        "64",
        "--lr",
        "3e-3",
        "--device",
        "cpu",
        *FAST,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run(
        [sys.executable, "-m", "gaca_cli", *args, "-o", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr
    torchrun = Path(sys.executable).with_name("torchrun")
    two = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", "-m", "gaca_cli", *args, "-o", str(tmp_path / "two"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout)["processes"] == 2
    a, b = load_state(tmp_path / "one"), load_state(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5, msg=k)
    ma = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(ma, mb):
        for key in ("loss", "kl", "ratio_mean", "ratio_max", "clip_frac", "grad_norm"):
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), key
