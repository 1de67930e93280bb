"""`gaca score` and `gaca train-offline` on a CUDA device, checked against the same runs on the CPU.

CI has no GPU, so every test here is skipped there ("no CUDA device"); on a machine with one,
`pytest tests/lm/test_cuda.py` runs them (about a minute). The models are the tiny local ones,
loaded by path as users load theirs.

- fp32 on the GPU gives the CPU's numbers up to float rounding (1e-4), for scoring and for
  training steps;
- the CUDA default (`--dtype auto`: bf16 weights for scoring, bf16 mixed precision for
  training) stays close to fp32 on a trained policy, whose log-probs are far from uniform,
  so a misplaced token could not hide inside the tolerance;
- real out-of-memory errors (a per-process memory cap on the GPU) make scoring back off to
  smaller batches and give the uncapped run's numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.log import columns as C

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

runner = CliRunner()
GPU_TOL = 1e-4  # fp32 on two devices: different kernels and summation orders, same maths


def invoke(*args) -> dict:
    res = runner.invoke(app, [*map(str, args), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def scored(path: Path) -> dict[tuple[str, int], dict]:
    return {(r["traj_id"], r["step_idx"]): r for r in pq.read_table(path).to_pylist()}


def assert_same_scores(a: Path, b: Path, tol: float, token_logprobs: bool = True) -> None:
    ra, rb = scored(a), scored(b)
    assert ra.keys() == rb.keys()
    for key, x in ra.items():
        y = rb[key]
        assert x[C.N_ACTION_TOKENS] == y[C.N_ACTION_TOKENS], key
        assert x[C.NLL_SUM] == pytest.approx(y[C.NLL_SUM], abs=tol * max(1, x[C.N_ACTION_TOKENS])), key
        if token_logprobs and x[C.N_ACTION_TOKENS]:
            np.testing.assert_allclose(x[C.TOKEN_LOGPROBS], y[C.TOKEN_LOGPROBS], atol=tol, rtol=0, err_msg=str(key))


# ----------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("rewrite", [False, True], ids=["append-only", "rewritten"])
def test_score_fp32_on_cuda_equals_the_cpu(rewrite, tiny_llama, tmp_path):
    """Packing (append-only histories) and one sequence per step (rewritten), batched on the GPU
    and on the CPU, fp32 on both: the same NLLs and token log-probs; the summary names the GPU."""
    from tests.lm.test_score import make_rows, write_log

    log = write_log(tmp_path / "log.parquet", make_rows(groups=2, trajs=3, steps=5, rewrite=rewrite, seed=5))
    common = ["score", log, "--model", tiny_llama, "--dtype", "fp32", "--token-logprobs"]
    gpu = invoke(*common, "--device", "cuda", "--max-batch-tokens", "256", "-o", tmp_path / "gpu.parquet")
    cpu = invoke(*common, "--device", "cpu", "-o", tmp_path / "cpu.parquet")
    assert gpu["device"].startswith("cuda") and cpu["device"] == "cpu"
    assert gpu["dtype"] == cpu["dtype"] == "fp32"
    assert gpu["forwards"] > 1  # several batches on the GPU
    assert_same_scores(tmp_path / "gpu.parquet", tmp_path / "cpu.parquet", GPU_TOL)


@pytest.fixture(scope="module")
def trained_policy(tiny_llama, tmp_path_factory):
    """The tiny Llama fitted to a few (context, action) pairs: log-probs far from uniform."""
    from tests.lm.test_score import make_rows, write_log
    from tests.lm.test_train_offline import fit_to_actions

    root = tmp_path_factory.mktemp("cuda-policy")
    rows = make_rows(groups=2, trajs=3, steps=4, seed=9)
    pairs = sorted({(r["prompt"], r["action"]) for r in rows})
    policy = fit_to_actions(tiny_llama, root / "policy", pairs[:12], steps=30)
    return policy, write_log(root / "log.parquet", rows)


def test_score_cuda_default_is_bf16_and_close_to_fp32(trained_policy, tmp_path):
    """`--device cuda` alone loads bf16 weights; its NLLs stay within bf16's precision of the
    fp32 ones (per token 0.05 nats plus 2 %), on a policy whose log-probs spread over several nats."""
    policy, log = trained_policy
    bf16 = invoke(
        "score", log, "--model", policy, "--device", "cuda", "--token-logprobs", "-o", tmp_path / "bf16.parquet"
    )
    fp32 = invoke(
        "score",
        log,
        "--model",
        policy,
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--token-logprobs",
        "-o",
        tmp_path / "fp32.parquet",
    )
    assert bf16["dtype"] == "bf16" and fp32["dtype"] == "fp32"
    ra, rb = scored(tmp_path / "bf16.parquet"), scored(tmp_path / "fp32.parquet")
    spread = np.ptp(np.concatenate([r[C.TOKEN_LOGPROBS] for r in rb.values() if r[C.N_ACTION_TOKENS]]))
    assert spread > 2.0  # the check below could not pass by accident
    for key, x in ra.items():
        if x[C.N_ACTION_TOKENS]:
            want = np.asarray(rb[key][C.TOKEN_LOGPROBS])
            np.testing.assert_allclose(x[C.TOKEN_LOGPROBS], want, atol=0.05, rtol=0.02, err_msg=str(key))


def long_rows(n_traj: int = 8, steps: int = 4, words: int = 420, seed: int = 3) -> list[dict]:
    """Rewritten histories of ~1,000 tokens per step: no packing, one long sequence per step."""
    import random

    from tests.lm.test_score import ACTIONS, OBSERVATIONS

    rng = random.Random(seed)
    rows = []
    for t in range(n_traj):
        for s in range(steps):
            text = " ".join(rng.choice(OBSERVATIONS) for _ in range(words // 8))
            rows.append(
                dict(
                    group_id=f"g{t // 4}",
                    traj_id=f"t{t}",
                    step_idx=s,
                    reward=float(s == steps - 1),
                    prompt=f"<|user|>Step {s}. {text}\n<|assistant|>",
                    action=rng.choice(ACTIONS),
                )
            )
    return rows


def test_score_backs_off_on_real_cuda_out_of_memory(tmp_path):
    """A GPU memory cap of the model + 64 MiB, and one batch asked for everything (~35k
    tokens through a 4-layer, 512-wide model): the forwards run out of memory, the scorer halves
    its batches until they fit, and the numbers equal those of small batches without the cap."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from gaca_cli.lm.models import load_causal_lm
    from gaca_cli.lm.scoring import ScoreConfig, run_score
    from gaca_cli.log.reading import read_log
    from tests.lm.test_score import write_log
    from tests.lm.tiny_models import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    log = write_log(tmp_path / "log.parquet", long_rows())
    loaded = load_causal_lm(str(model_dir), dtype="fp32", device="cuda")

    def score(out: Path, max_batch_tokens: int) -> dict:
        cfg = ScoreConfig(
            model=str(model_dir), dtype="fp32", device="cuda", token_logprobs=True, max_batch_tokens=max_batch_tokens
        )
        return run_score(read_log([log]), cfg, out, loaded=loaded).summary

    small = score(tmp_path / "small.parquet", 2048)
    assert small["oom_backoffs"] == 0
    torch.cuda.empty_cache()
    device = torch.cuda.current_device()  # the model's (loaded as plain "cuda")
    total = torch.cuda.get_device_properties(device).total_memory
    cap = torch.cuda.memory_reserved(device) + (64 << 20)
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    try:
        capped = score(tmp_path / "capped.parquet", 1 << 20)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
    assert small["tokens"] > 30_000
    assert capped["oom_backoffs"] >= 2, capped
    assert capped["forwards"] > 1
    assert_same_scores(tmp_path / "capped.parquet", tmp_path / "small.parquet", 1e-5)


# ---------------------------------------------------------------------------------- training


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_fp32_on_cuda_matches_the_cpu(tiny_llama, tmp_path):
    """Three PPO steps with micro-batches and a KL term, fp32 on the GPU and on the CPU: the same
    losses, KL, ratios and gradient norms at every step, and the same weights after them. AdamW's
    first steps move each weight by about ±lr, so a gradient within rounding of zero may take the
    other sign on the other device: at most one weight in 10,000 may differ by more than 1e-5."""
    from tests.lm.test_train_offline import FAST, load_state, many_rows, write_log

    rng = np.random.default_rng(4)
    log = write_log(tmp_path / "log.parquet", many_rows())
    scored_log = tmp_path / "scored.parquet"
    invoke(
        "score", log, "--model", tiny_llama, "--device", "cpu", "--dtype", "fp32", "--token-logprobs", "-o", scored_log
    )
    table = pq.read_table(scored_log)
    noisy = [[x - float(rng.uniform(0, 0.3)) for x in lps] for lps in table.column(C.TOKEN_LOGPROBS).to_pylist()]
    pq.write_table(
        table.set_column(
            table.schema.get_field_index(C.TOKEN_LOGPROBS), C.TOKEN_LOGPROBS, pa.array(noisy, pa.list_(pa.float32()))
        ),
        scored_log,
    )
    lr = 1e-3
    args = [
        "train-offline",
        scored_log,
        "--model",
        tiny_llama,
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
        str(lr),
        "--dtype",
        "fp32",
        *FAST,
    ]
    gpu = invoke(*args, "--device", "cuda", "-o", tmp_path / "gpu")
    cpu = invoke(*args, "--device", "cpu", "-o", tmp_path / "cpu")
    assert gpu["device"].startswith("cuda") and cpu["device"] == "cpu"
    assert gpu["mixed_precision"] == cpu["mixed_precision"] == "no"
    for x, y in zip(metrics(tmp_path / "gpu"), metrics(tmp_path / "cpu"), strict=True):
        for key in ("loss", "kl", "ratio_mean", "ratio_max", "clip_frac", "grad_norm", "tokens"):
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), (x["step"], key)
    a, b = load_state(tmp_path / "gpu"), load_state(tmp_path / "cpu")
    assert a.keys() == b.keys()
    for k in a:
        diff = (a[k].double() - b[k].double()).abs()
        assert float(diff.max()) <= 2 * lr * 3 + 1e-5, k
        assert float((diff > 1e-5).double().mean()) <= 1e-4, k


def test_train_cuda_default_is_bf16_mixed_precision_and_learns(tmp_path, tiny_llama):
    """`--device cuda` alone trains with bf16 autocast over fp32 weights: from a policy that
    generated both actions, four PPO steps raise log π(GOOD) and lower log π(BAD) (measured in
    fp32 on the CPU), the first step's ratio is 1 within bf16's precision, and the saved weights
    are fp32."""
    from tests.lm.test_train_offline import (
        BAD,
        FAST,
        GOOD,
        PROMPT,
        fit_to_actions,
        load_state,
        slow_action_logprob,
        two_action_rows,
        write_log,
    )

    start = fit_to_actions(tiny_llama, tmp_path / "start", [(PROMPT, GOOD), (PROMPT, BAD)])
    log = write_log(tmp_path / "log.parquet", two_action_rows())
    scored_log = tmp_path / "scored.parquet"
    invoke("score", log, "--model", start, "--device", "cuda", "--token-logprobs", "-o", scored_log)
    out = tmp_path / "out"
    summary = invoke(
        "train-offline",
        scored_log,
        "--model",
        start,
        "--loss",
        "ppo",
        "--max-steps",
        "4",
        "--lr",
        "3e-3",
        "--batch-size",
        "2",
        "--device",
        "cuda",
        "-o",
        out,
        *FAST,
    )
    assert summary["device"].startswith("cuda") and summary["mixed_precision"] == "bf16"
    good0, bad0 = (slow_action_logprob(start, PROMPT, a) for a in (GOOD, BAD))
    good1, bad1 = (slow_action_logprob(out, PROMPT, a) for a in (GOOD, BAD))
    assert good1 > good0 + 0.05, (good0, good1)
    assert bad1 < bad0 - 0.1, (bad0, bad1)
    first = metrics(out)[0]
    assert first["ratio_mean"] == pytest.approx(1.0, abs=0.03)
    assert all(np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"]) for m in metrics(out))
    assert {t.dtype for t in load_state(out).values()} == {torch.float32}


def test_lora_on_cuda_loads_on_the_cpu(tiny_llama, tmp_path):
    """A LoRA adapter trained on the GPU (and its merge) load with plain transformers on the
    CPU and give the same logits as each other, and not the base model's."""
    from transformers import AutoModelForCausalLM

    from tests.lm.test_train_offline import FAST, many_rows, write_log

    log = write_log(tmp_path / "log.parquet", many_rows())
    args = [
        "train-offline",
        log,
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
        "--device",
        "cuda",
        *FAST,
    ]
    invoke(*args, "--merge", "-o", tmp_path / "merged")
    ids = torch.tensor([[5, 17, 40, 99, 3]])
    base = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    adapter = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "adapter").eval()
    with torch.no_grad():
        lb, lm, la = (m(input_ids=ids).logits for m in (base, merged, adapter))
    assert not torch.allclose(lm, lb)
    torch.testing.assert_close(la, lm, rtol=0, atol=1e-4)
