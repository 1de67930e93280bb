"""Benchmark: tokens/s of `gaca train-offline` against a plain transformers training loop.

Same model (a random-weight Llama built here, loaded from a local directory), same data
(synthetic agent steps: a context of ~`ctx` tokens and an action of ~`act` tokens, random
advantages), same batches and micro-batches (the steps of each optimiser step, in the same
order and split), same objective (`--loss pg`: −A·log π averaged over the step's action
tokens), same AdamW, clipping and schedule-free constant lr. Three loops:

- plain (full logits): what one writes first — padded batch with an attention mask, logits at
  every position, log_softmax over [B, L, V], gather at the action tokens;
- plain (action logits): the same loop with `logits_to_keep` at the action positions only (a
  boolean mask, or on older transformers the positions: `gaca_cli.lm.policy.kept_logits`), no
  attention mask (gaca's forward): it isolates gaca's bookkeeping from its forward trick;
- gaca train-offline (the library call the command makes), timed per optimiser step from its
  metrics.jsonl (`step_s`), and end to end (load, tokenise, train, save).

Each loop first runs `--warmup` optimiser steps that are not timed (the first forwards of a
process are several times slower), then `--steps` timed ones; the loops alternate for
`--repeats` rounds and the table shows the median. The ratio is against the plain
full-logits loop; overhead = 1 − gaca / contiguous_decoded(action logits).

Devices and precision (`--device cpu | cuda`, `--dtype fp32 | bf16`), like for like: gaca gets
them through its TrainConfig as `gaca train-offline --device/--dtype` would; it loads the model
in float32 and, with bf16, trains under accelerate's bf16 mixed precision. The plain loops do the same by hand: float32 master weights
on the device, `torch.autocast(device, bfloat16)` around the forward, the loss in float32. On
CUDA every timer read follows a `torch.cuda.synchronize()` (gaca's `step_s` is read after its
metrics' `.tolist()`, a device-to-host copy that waits for the step's kernels), and the table
shows each loop's peak allocated memory (`torch.cuda.max_memory_allocated`, reset between loops).

    python bench/train.py --quick          # ~30 s: 2.5M parameters, vocabulary 8192
    python bench/train.py                  # a few minutes on 2 cores: 19M parameters, vocabulary 32000
    python bench/train.py --quick --dtype bf16          # the same smoke run under bf16 autocast
    # one GPU (H200-sized: ~0.87B parameters, 64 logged steps of ~1.1k tokens per optimiser
    # step, micro-batches of ≤ 16k padded tokens; about two minutes with building and saving):
    python bench/train.py --device cuda --dtype bf16 --hidden 2048 --layers 16 --vocab 32000 \
        --ctx 1024 --act 64 --batch-size 64 --max-batch-tokens 16384 --steps 4 --repeats 2
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_model(directory: Path, hidden: int, layers: int, vocab: int, seed: int = 0, device: str = "cpu") -> int:
    """A random-weight Llama with a byte-level BPE tokenizer (from tests/lm/tiny_models.py); the
    model's vocabulary is `vocab` (≥ the tokenizer's) so the output projection costs what a real
    model's does. Saved in float32. The random initialisation runs on `device` (on CUDA it takes
    a moment where a 1B model takes tens of seconds on CPU cores; safetensors copies the weights
    to the host to save them). Returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tests.lm.tiny_models import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=int(hidden * 8 / 3) // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096,
        vocab_size=max(vocab, len(tok)),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def build_log(path: Path, n_steps: int, ctx: int, act: int, vocab: int, seed: int = 0) -> None:
    """Steps with token ids (prompt_token_ids / action_token_ids), lengths ±25 %, A ~ N(0, 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n_ctx = rng.integers(int(ctx * 0.75), int(ctx * 1.25) + 1, size=n_steps)
    n_act = rng.integers(max(1, int(act * 0.75)), int(act * 1.25) + 1, size=n_steps)
    table = pa.table(
        {
            "group_id": [f"g{i // 64}" for i in range(n_steps)],
            "traj_id": [f"t{i // 8}" for i in range(n_steps)],
            "step_idx": np.arange(n_steps) % 8,
            "reward": np.zeros(n_steps),
            "prompt_token_ids": pa.array(
                [rng.integers(3, vocab, size=k).tolist() for k in n_ctx], pa.list_(pa.int32())
            ),
            "action_token_ids": pa.array(
                [rng.integers(3, vocab, size=k).tolist() for k in n_act], pa.list_(pa.int32())
            ),
            "advantage": rng.normal(size=n_steps),
        }
    )
    pq.write_table(table, path)


def sync(device) -> None:
    """Wait for the device's queued work (before every timer read on CUDA)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(
    model_dir: Path, data, config, steps: int, warmup: int, action_logits_only: bool, device=None, bf16: bool = False
) -> dict:
    """The baseline: a training loop written with nothing but torch and transformers. float32
    weights on `device`; with `bf16`, the forward runs under torch.autocast(bfloat16) (what
    accelerate's mixed precision does) and the loss is computed in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    from gaca_cli.lm.policy import kept_logits, logits_keep_mode
    from gaca_cli.lm.training import BatchPlan, micro_batches

    device = device if device is not None else torch.device("cpu")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    model.train()
    keep_mode = logits_keep_mode(model)  # a boolean logits_to_keep mask where transformers takes one
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    plan = BatchPlan(len(data), config.batch_size, config.seed)
    lengths_all, n_ctx_all = data.lengths, data.n_context
    times, tokens = [], []
    for step in range(warmup + steps):
        sync(device)
        started = time.perf_counter()
        batch = plan.batch(step)
        lengths = lengths_all[batch]
        n_tok = float((lengths - n_ctx_all[batch]).sum())
        n_seen = 0
        for group in micro_batches(lengths, config.max_batch_tokens):
            members = batch[group]
            width = int(lengths_all[members].max())
            ids = torch.zeros((len(members), width), dtype=torch.long)
            mask = torch.zeros((len(members), width), dtype=torch.long)
            act = torch.zeros((len(members), width), dtype=torch.bool)  # act[b, p]: token p is an action token
            adv = torch.zeros((len(members), width))
            for i, m in enumerate(members):
                seq = torch.from_numpy(data.input_ids[m])
                ids[i, : len(seq)] = seq
                mask[i, : len(seq)] = 1
                act[i, int(n_ctx_all[m]) : len(seq)] = True
                adv[i, :] = float(data.advantage[m])
            ids, mask, act, adv = ids.to(device), mask.to(device), act.to(device), adv.to(device)
            if action_logits_only:
                keep = act[:, 1:]  # position p predicts token p + 1
                keep = torch.cat([keep, torch.zeros((len(members), 1), dtype=torch.bool, device=device)], dim=1)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    logits = kept_logits(model, ids, keep, keep_mode).float()
                logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][act[:, 1:]].unsqueeze(-1)).squeeze(-1)
                loss = -(adv[:, 1:][act[:, 1:]] * logp).sum() / n_tok
            else:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    out = model(input_ids=ids, attention_mask=mask)
                logits = out.logits.float()
                logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
                loss = -(adv[:, 1:] * logp * act[:, 1:]).sum() / n_tok
            loss.backward()
            n_seen += int(lengths_all[members].sum())
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - started)
            tokens.append(n_seen)
    return {"tokens": sum(tokens), "seconds": sum(times)}


def gaca_loop(log_path: Path, model_dir: Path, config, work: Path, steps: int, warmup: int, device=None) -> dict:
    """`gaca train-offline` as the command calls it; steady-state time from metrics.jsonl."""
    from dataclasses import replace

    import torch

    from gaca_cli.lm.training import train
    from gaca_cli.log.reading import read_log

    device = device if device is not None else torch.device("cpu")
    out = work / "gaca-out"
    shutil.rmtree(out, ignore_errors=True)
    sync(device)
    started = time.perf_counter()
    result = train(read_log([log_path]), replace(config, max_steps=warmup + steps), out)
    sync(device)
    wall = time.perf_counter() - started
    timed = result.metrics[warmup:]
    return {
        "tokens": sum(m["tokens"] for m in timed),
        "seconds": sum(m["step_s"] for m in timed),
        "end_to_end_tokens": sum(m["tokens"] for m in result.metrics),
        "end_to_end_s": wall,
        "device": result.summary.get("device"),
        "mixed_precision": result.summary.get("mixed_precision"),
    }


def measured(device, run):
    """run() with the CUDA peak-memory counter reset first; returns (result, peak bytes or None).
    Whatever the previous loop left is collected first, so each loop starts from the same state."""
    import torch

    gc.collect()
    if device.type != "cuda":
        return run(), None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    result = run()
    sync(device)
    return result, torch.cuda.max_memory_allocated(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, few steps (a smoke run)")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--vocab", type=int, default=None, help="model vocabulary size")
    parser.add_argument("--ctx", type=int, default=None, help="mean context tokens per step")
    parser.add_argument("--act", type=int, default=None, help="mean action tokens per step")
    parser.add_argument("--batch-size", type=int, default=None, help="logged steps per optimiser step")
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed optimiser steps per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed optimiser steps first")
    parser.add_argument("--repeats", type=int, default=None, help="alternating rounds (median shown)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where all three loops train (cuda: gaca gets --device auto, its way to the GPU)",
    )
    parser.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="fp32, or bf16 autocast over float32 weights (gaca: accelerate's bf16 mixed precision)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    quick = dict(
        hidden=128, layers=2, vocab=8192, ctx=96, act=12, batch_size=16, max_batch_tokens=1024, steps=4, repeats=1
    )
    full = dict(
        hidden=256, layers=4, vocab=32000, ctx=192, act=24, batch_size=16, max_batch_tokens=4096, steps=3, repeats=3
    )
    p = {
        k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in (quick if args.quick else full).items()
    }

    import torch

    from gaca_cli.lm.train_config import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bf16 = args.dtype == "bf16"
    work = Path(tempfile.mkdtemp(prefix="gaca-bench-train-"))
    try:
        model_dir = work / "model"
        n_params = build_model(model_dir, p["hidden"], p["layers"], p["vocab"], device=args.device)
        n_steps_log = p["batch_size"] * (args.warmup + p["steps"])
        log_path = work / "log.parquet"
        build_log(log_path, n_steps_log, p["ctx"], p["act"], min(p["vocab"], 300))
        config = TrainConfig(
            model=str(model_dir),
            loss="pg",
            lr=1e-5,
            warmup_ratio=0.0,
            min_lr_ratio=1.0,
            batch_size=p["batch_size"],
            max_batch_tokens=p["max_batch_tokens"],
            save_every=0,
            device=device.type,
            dtype=args.dtype,
        )
        # the data exactly as gaca builds it, for the baselines
        from gaca_cli.lm.models import load_tokenizer
        from gaca_cli.lm.train_data import build_train_data
        from gaca_cli.log.checks import prepare_log
        from gaca_cli.log.reading import read_log

        log = read_log([log_path])
        index, _ = prepare_log(log, "train-offline")
        data = build_train_data(log, index, load_tokenizer(str(model_dir)), config)

        names = ("plain (full logits)", "plain (action logits)", "gaca train-offline")
        rounds: dict[str, list[float]] = {name: [] for name in names}
        peaks: dict[str, list[int]] = {name: [] for name in names}
        end_to_end: list[float] = []
        gaca_ran_on = None
        for _ in range(p["repeats"]):
            for name in names:
                if name == "gaca train-offline":
                    run = functools.partial(
                        gaca_loop, log_path, model_dir, config, work, p["steps"], args.warmup, device
                    )
                else:
                    only = name == "plain (action logits)"
                    run = functools.partial(
                        plain_loop,
                        model_dir,
                        data,
                        config,
                        p["steps"],
                        args.warmup,
                        action_logits_only=only,
                        device=device,
                        bf16=bf16,
                    )
                r, used = measured(device, run)
                rounds[name].append(r["tokens"] / r["seconds"])
                if used is not None:
                    peaks[name].append(used)
                if name == "gaca train-offline":
                    end_to_end.append(r["end_to_end_tokens"] / r["end_to_end_s"])
                    gaca_ran_on = (r["device"], r["mixed_precision"])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    median = {k: statistics.median(v) for k, v in rounds.items()}
    base = median["plain (full logits)"]
    same_math = median["plain (action logits)"]
    peak = {k: max(v) for k, v in peaks.items() if v}
    results = {
        "params": n_params,
        "threads": torch.get_num_threads(),
        **p,
        "warmup": args.warmup,
        "device": args.device,
        "device_name": device_name,
        "dtype": args.dtype,
        "gaca_device": gaca_ran_on[0],
        "gaca_mixed_precision": gaca_ran_on[1],
        "peak_memory_bytes": peak or None,
        "tokens_per_s": median,
        "rounds": rounds,
        "gaca_end_to_end_tokens_per_s": statistics.median(end_to_end),
        "gaca_vs_plain_full_logits": median["gaca train-offline"] / base,
        "gaca_overhead_vs_same_math": 1.0 - median["gaca train-offline"] / same_math,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    flops = 6.0 * n_params
    print(
        f"model: Llama {p['layers']}×{p['hidden']}, vocab {p['vocab']}, {n_params / 1e6:.1f}M parameters; "
        f"steps: ~{p['ctx']} context + ~{p['act']} action tokens; batch {p['batch_size']} steps, "
        f"micro-batches ≤ {p['max_batch_tokens']} padded tokens; {p['steps']} timed optimiser steps after "
        f"{args.warmup} warm-up, median of {p['repeats']} alternating round(s); torch threads {torch.get_num_threads()}"
    )
    print(
        f"device: {device_name} ({args.device}), dtype {args.dtype}"
        + (" (bf16 autocast over float32 weights)" if bf16 else "")
        + f"; gaca ran on {gaca_ran_on[0]}, mixed precision {gaca_ran_on[1]}"
    )
    if peak:
        print(f"{'loop':<24}{'tokens/s':>12}{'TFLOP/s (6N)':>14}{'ratio':>8}{'peak GiB':>10}")
        for name, value in median.items():
            print(
                f"{name:<24}{value:>12,.0f}{flops * value / 1e12:>14.1f}{value / base:>8.2f}{peak[name] / 2**30:>10.1f}"
            )
    else:
        print(f"{'loop':<24}{'tokens/s':>12}{'GFLOP/s (6N)':>14}{'ratio':>8}")
        for name, value in median.items():
            print(f"{name:<24}{value:>12,.0f}{flops * value / 1e9:>14.2f}{value / base:>8.2f}")
    print(f"gaca end to end (load, tokenise, warm-up, save): {statistics.median(end_to_end):,.0f} tokens/s")
    print(
        f"gaca overhead against the same maths in a plain loop: {100 * results['gaca_overhead_vs_same_math']:+.1f}% "
        "(target < 15%; negative = faster)"
    )


if __name__ == "__main__":
    main()
