"""Benchmark: `gaca score` against an lm-evaluation-harness-style per-step scorer.

    python bench/score.py --quick          # a minute or two on a laptop CPU
    python bench/score.py                  # 20-step histories, a ~20M and a ~100M model
    python bench/score.py --quick --dtype bf16   # the same, the model loaded in bfloat16
    python bench/score.py --groups 64 --rollouts 8 --steps 20 --device cuda
    # one GPU (H200): a 100M and a TinyLlama-shaped 1B model loaded in bfloat16, the default
    # logs (2 × 320 steps of up to ~1.7k tokens); about a minute with building and saving:
    python bench/score.py --device cuda --dtype bf16 --models llama-100M,llama-1B
    # the first pass over a log's batch shapes against a second one, and without cuDNN's
    # attention (on an H200 the first pass cost ~50 ms more per new batch shape):
    python bench/score.py --device cuda --dtype bf16 --models llama-1B --again
    python bench/score.py --device cuda --dtype bf16 --models llama-1B --again --sdpa no-cudnn

Baseline (what lm-evaluation-harness's `loglikelihood` does for each (context,
continuation) request): tokenise context and context + continuation, run ONE sequence per
step through the model with full logits, float32 log_softmax over the whole vocabulary at
every position, gather the continuation's tokens.

`gaca score`: the library call (`run_score`) with the model already loaded, so both sides
time the same things (tokenisation + forwards + log-probs); model loading is excluded.

Logs (synthetic multi-turn rollouts, text prompts after a chat template): GROUPS episode
groups × ROLLOUTS rollouts × STEPS steps, a shared task prompt per group, and
- append-only: each step's prompt is the previous prompt + action + a new observation;
- rewritten: the same prompts, except the first user turn is rewritten at every step
  ("Step t. …"), so no step is a prefix of the next (packing impossible);
- windowed: verl-agent's prompt, rebuilt each step from an instruction template, the task and
  the last 2 (observation, action) turns (~400 tokens of template and task); every rollout of a
  group starts from the same observation, so step-0 contexts are identical.
Every log is scored by gaca with and without prefix sharing (`--no-share-prefixes`, the scorer
before shared prefixes), side by side; "tok fwd" counts the tokens each method ran through the
model and "× bound" divides it by the log's distinct-token lower bound (a trie's nodes).

Models: random-weight Llamas saved to a temporary directory with a small byte-level BPE
tokenizer; the model's vocabulary is 32,000 (as real ones are) even though the tokenizer
only emits the first few hundred ids, so the vocabulary projection costs what it would.

Reported per (model, log, method): wall seconds; tokens forwarded; step tokens per second
(Σ over steps of context + action tokens, the same work for both methods, ÷ wall); the
speed-up against the baseline; the FLOP floor of the task (2 × (body parameters × unique
tokens + head parameters × action tokens) ÷ the measured matmul FLOP/s: the issue's
2 × parameters × unique tokens, with the vocabulary projection counted only where it is
needed) and the multiple of it each method took; the largest logits tensor either
method builds (measured peak memory on CUDA); and the largest |Δ nll_sum| between the two.
Every model runs a warm-up of both methods first (the first forwards of a process are
several times slower).

`--dtype fp32 | bf16`: the dtype the model is loaded in, for both methods (gaca's ScoreConfig
gets the same); the baseline still takes a float32 log_softmax of the logits, gaca normalises in
float32 as always. The floor's matmul rate is measured in that dtype (1024² matrices on the CPU,
4096² on CUDA, where small matmuls are far from the roofline). The table's header names the
device (torch.cuda.get_device_name on CUDA) and the dtype. On CUDA the memory column is each
method's measured peak allocation above the resident model (torch.cuda.max_memory_allocated).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = (
    "hall corridor garden kitchen key door table brass locked open north south east west lamp "
    "drawer shelf coin map rope torch window stairs cellar attic box chest note bread water"
).split()
ACTIONS = [
    "go to hall",
    "go to garden",
    "take key",
    "look around",
    "open door with key",
    "examine lamp",
    "go north",
    "inventory",
    "take coin from drawer",
    "read note",
]

MODELS = {
    # name: (hidden, layers, heads, kv heads, intermediate)
    "llama-20M": (256, 4, 4, 4, 1024),
    "llama-100M": (768, 6, 12, 12, 2048),
    "llama-tiny": (64, 2, 4, 4, 128),
    "llama-1B": (2048, 16, 32, 8, 5632),  # TinyLlama-1.1B's shape with 16 layers (0.85B parameters)
}
VOCAB = 32_000
WINDOW = 2  # history turns in a windowed prompt
TEMPLATE = (  # a verl-agent-style instruction block: with the task, ~400 tokens of the bench's tokenizer
    "You are an expert agent operating in a text household. Your current observation and your recent "
    "history are given below. Think about what to do, then answer with exactly one admissible action. "
    "Admissible actions are: go to X, take X from Y, put X in/on Y, open X, close X, use X, examine X, "
    "look, inventory. Reply with the action only. "
)


def make_logs(
    directory: Path, groups: int, rollouts: int, steps: int, obs_words: int, seed: int = 0
) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    logs: dict[str, list[dict]] = {"append-only": [], "rewritten": [], "windowed": []}
    for g in range(groups):
        task = "You are an agent in a house. Task: " + " ".join(rng.choice(WORDS) for _ in range(40))
        template = TEMPLATE + task
        first_obs = " ".join(rng.choice(WORDS) for _ in range(obs_words))
        for r in range(rollouts):
            turns: list[tuple[str, str]] = []
            for t in range(steps):
                # every rollout of a group starts from the same observation
                obs = first_obs if t == 0 else " ".join(rng.choice(WORDS) for _ in range(obs_words))
                action = rng.choice(ACTIONS)
                turns.append((obs, action))
                for kind in logs:
                    if kind == "windowed":  # verl-agent's prompt: template + task + the last WINDOW turns
                        recent = "".join(f"<|user|>{o}\n<|assistant|>{a}\n" for o, a in turns[:-1][-WINDOW:])
                        prompt = f"<|system|>{template}\n{recent}<|user|>{obs}\n<|assistant|>"
                        logs[kind].append(
                            {
                                "group_id": f"g{g}",
                                "traj_id": f"g{g}/r{r}",
                                "step_idx": t,
                                "reward": 0.0,
                                "prompt": prompt,
                                "action": action,
                            }
                        )
                        continue
                    parts = [f"<|system|>{task}\n"]
                    for i, (o, a) in enumerate(turns):
                        if kind == "rewritten" and i == 0:
                            o = f"Step {t}. {o}"
                        parts.append(f"<|user|>{o}\n<|assistant|>")
                        if i < t:
                            parts.append(f"{a}\n")
                    logs[kind].append(
                        {
                            "group_id": f"g{g}",
                            "traj_id": f"g{g}/r{r}",
                            "step_idx": t,
                            "reward": 0.0,
                            "prompt": "".join(parts),
                            "action": action,
                        }
                    )
    paths = {}
    for kind, rows in logs.items():
        schema = pa.schema(
            [
                ("group_id", pa.string()),
                ("traj_id", pa.string()),
                ("step_idx", pa.int32()),
                ("reward", pa.float64()),
                ("prompt", pa.large_string()),
                ("action", pa.large_string()),
            ]
        )
        paths[kind] = directory / f"{kind}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), paths[kind])
    return paths


def build_llama(directory: Path, name: str, device: str = "cpu") -> Path:
    """A random-weight Llama of MODELS[name], saved in float32 with safetensors. The random
    initialisation runs on `device` (seconds for the 1B model on CUDA, tens of seconds on CPU
    cores); safetensors copies the weights to the host to save them."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tests.lm.tiny_models import build_tokenizer

    hidden, layers, heads, kv, inter = MODELS[name]
    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=8192,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    path = directory / name
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def matmul_flops(device, dtype, seconds: float = 1.5) -> float:
    """Sustained FLOP/s of a square matmul (the roofline the floor is computed against)."""
    import torch

    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device) -> int | None:
    """CUDA: wait, reset the peak-memory counter, return the bytes allocated now (the resident
    model); None elsewhere."""
    import torch

    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_above(device, resident: int | None) -> int | None:
    """CUDA: the peak allocation since reset_peak, above what was resident then; None elsewhere."""
    import torch

    if device.type != "cuda" or resident is None:
        return None
    return max(0, torch.cuda.max_memory_allocated(device) - resident)


def baseline(model, tok, rows: list[dict], device) -> tuple[np.ndarray, int, int]:
    """lm-eval-harness style: one (context + continuation) sequence per step, full logits,
    float32 log_softmax everywhere. Returns (nll_sum per row, tokens forwarded, largest
    logits tensor in bytes)."""
    import torch
    import torch.nn.functional as F

    nll = np.zeros(len(rows))
    tokens = biggest = 0
    with torch.inference_mode():
        for i, row in enumerate(rows):
            ctx = tok(row["prompt"], add_special_tokens=False).input_ids
            whole = tok(row["prompt"] + row["action"], add_special_tokens=False).input_ids
            cont = whole[len(ctx) :]
            inp = torch.tensor([ctx + cont], device=device)
            logits = F.log_softmax(model(inp).logits.float(), dim=-1)  # [1, L, V]
            lp = logits[0, len(ctx) - 1 : -1].gather(1, torch.tensor(cont, device=device)[:, None])
            nll[i] = -float(lp.double().sum())
            tokens += inp.shape[1]
            biggest = max(biggest, logits.numel() * 4)
    return nll, tokens, biggest


def gaca(
    log_path: Path, model_dir: Path, loaded, out: Path, max_batch_tokens: int, dtype: str = "fp32", share: bool = True
):
    from gaca_cli.lm.scoring import ScoreConfig, run_score
    from gaca_cli.log.reading import read_log

    config = ScoreConfig(
        model=str(model_dir),
        dtype=dtype,
        device=str(loaded[2]),
        max_batch_tokens=max_batch_tokens,
        share_prefixes=share,
    )
    return run_score(read_log([log_path]), config, out, loaded=loaded)


def distinct_tokens(tok, rows: list[dict]) -> int:
    """The lower bound of tokens any scorer must forward: the nodes of a trie over every step's
    context + action tokens (each distinct prefix once)."""
    seqs = sorted(tuple(tok(r["prompt"] + r["action"], add_special_tokens=False).input_ids) for r in rows)
    total, previous = 0, ()
    for seq in seqs:
        common = 0
        while common < min(len(seq), len(previous)) and seq[common] == previous[common]:
            common += 1
        total += len(seq) - common
        previous = seq
    return total


def step_tokens(tok, rows: list[dict]) -> int:
    return sum(len(tok(r["prompt"] + r["action"], add_special_tokens=False).input_ids) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny logs, small and tiny models (seconds)")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--obs-words", type=int, default=12)
    ap.add_argument("--models", default="llama-20M,llama-100M", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    ap.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="the dtype the model is loaded in (both methods) and the floor's matmuls are measured in",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--max-batch-tokens", type=int, default=4096)
    ap.add_argument(
        "--sdpa",
        choices=("default", "no-cudnn"),
        default="default",
        help="attention kernels torch may pick for both methods: its default order, or every one but "
        "cuDNN's (which builds a plan for each new batch shape on Hopper)",
    )
    ap.add_argument(
        "--again", action="store_true", help="also time gaca a second time on each log (every batch shape seen before)"
    )
    args = ap.parse_args()
    if args.quick:
        args.groups, args.rollouts, args.steps, args.obs_words = 2, 2, 8, 8
        args.models = "llama-tiny,llama-20M"

    import pyarrow.parquet as pq
    import torch

    from gaca_cli.lm.models import load_causal_lm
    from gaca_cli.lm.scoring import HEAD_CHUNK_BYTES

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device here")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    flops = matmul_flops(device, torch_dtype)
    header = (
        f"# device {device} ({device_name}), dtype {args.dtype}, attention {args.sdpa}, "
        f"{torch.get_num_threads()} threads, "
        f"matmul {flops / 1e9:,.1f} GFLOP/s ({args.dtype}); "
        f"logs: {args.groups} groups × {args.rollouts} rollouts × {args.steps} steps"
    )
    print(header, flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        logs = make_logs(tmp, args.groups, args.rollouts, args.steps, args.obs_words)
        (tmp / "warm").mkdir()
        warm = make_logs(tmp / "warm", 1, 2, 3, 4)
        for name in args.models.split(","):
            model_dir = build_llama(tmp, name, str(device))
            loaded = load_causal_lm(str(model_dir), dtype=args.dtype, device=str(device))
            model, tok = loaded[0], loaded[1]
            head_params = model.get_output_embeddings().weight.numel()
            body_params = (
                sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel() - head_params
            )
            warm_rows = pq.read_table(warm["append-only"]).to_pylist()
            kernels = contextlib.nullcontext()
            if args.sdpa == "no-cudnn":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                kernels = sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
            with kernels:
                for _ in range(2):  # warm-up: both paths, several shapes
                    baseline(model, tok, warm_rows, device)
                    gaca(
                        warm["append-only"],
                        model_dir,
                        loaded,
                        tmp / "warm.out.parquet",
                        args.max_batch_tokens,
                        args.dtype,
                    )
                for kind, path in logs.items():
                    rows = pq.read_table(path).to_pylist()
                    work = step_tokens(tok, rows)
                    resident = reset_peak(device)
                    t0 = time.perf_counter()
                    ref, base_tokens, base_logits = baseline(model, tok, rows, device)
                    sync(device)
                    base_wall = time.perf_counter() - t0
                    base_peak = peak_above(device, resident)
                    t0 = time.perf_counter()
                    unshared = gaca(
                        path,
                        model_dir,
                        loaded,
                        tmp / f"{name}.{kind}.noshare.parquet",
                        args.max_batch_tokens,
                        args.dtype,
                        share=False,
                    )
                    sync(device)
                    wall_noshare = time.perf_counter() - t0
                    resident = reset_peak(device)
                    t0 = time.perf_counter()
                    run = gaca(
                        path, model_dir, loaded, tmp / f"{name}.{kind}.out.parquet", args.max_batch_tokens, args.dtype
                    )
                    sync(device)
                    wall = time.perf_counter() - t0
                    got = run.table.column("nll_sum").to_numpy()
                    s = run.summary
                    # the task's floor: every unique token through the body, action tokens through the head
                    floor = 2 * (body_params * s["tokens"] + head_params * s["action_tokens"]) / flops
                    gaca_logits = min(HEAD_CHUNK_BYTES, s["action_tokens"] * VOCAB * 4)
                    peak = peak_above(device, resident)
                    results.append(
                        dict(
                            model=name,
                            params=body_params + head_params,
                            log=kind,
                            base_wall=base_wall,
                            base_tokens=base_tokens,
                            wall=wall,
                            tokens=s["tokens"],
                            work=work,
                            floor=floor,
                            packed=f"{s['packed_trajectories']}/{s['trajectories']}",
                            base_logits=base_logits,
                            gaca_logits=gaca_logits,
                            peak=peak,
                            base_peak=base_peak,
                            diff=float(np.max(np.abs(got - ref))),
                            wall_noshare=wall_noshare,
                            fwd=s["forwarded_tokens"],
                            fwd_noshare=unshared.summary["forwarded_tokens"],
                            lower=distinct_tokens(tok, rows),
                            diff_noshare=float(np.max(np.abs(got - unshared.table.column("nll_sum").to_numpy()))),
                        )
                    )
                    r = results[-1]
                    print(
                        f"# {name} {kind}: baseline {base_wall:.1f} s, gaca {wall:.1f} s "
                        f"(×{base_wall / wall:.1f}), without prefix sharing {wall_noshare:.1f} s "
                        f"(×{wall_noshare / wall:.1f}); forwarded {r['fwd']:,} tokens, "
                        f"{r['fwd'] / r['lower']:.2f}× the distinct-token bound; max |Δnll| {r['diff']:.1e}",
                        flush=True,
                    )
                    if args.again:
                        t0 = time.perf_counter()
                        gaca(
                            path,
                            model_dir,
                            loaded,
                            tmp / f"{name}.{kind}.again.parquet",
                            args.max_batch_tokens,
                            args.dtype,
                        )
                        sync(device)
                        print(
                            f"# {name} {kind}: gaca again (every batch shape seen before) {time.perf_counter() - t0:.2f} s",
                            flush=True,
                        )
            del model, tok, loaded
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print()
    print(header.removeprefix("# "))
    print_table(results, flops)


def print_table(results: list[dict], flops: float) -> None:
    head = (
        "model",
        "log",
        "method",
        "wall s",
        "tok fwd",
        "× bound",
        "step tok/s",
        "× baseline",
        "× no sharing",
        "floor s",
        "× floor",
        "logits MB",
        "packed",
        "max|Δnll|",
    )
    lines = []
    for r in results:
        lines.append(
            (
                r["model"],
                r["log"],
                "baseline",
                f"{r['base_wall']:.2f}",
                f"{r['base_tokens']:,}",
                f"{r['base_tokens'] / r['lower']:.2f}",
                f"{r['work'] / r['base_wall']:,.0f}",
                "1.0×",
                "-",
                f"{r['floor']:.2f}",
                f"{r['base_wall'] / r['floor']:.1f}",
                f"{(r['base_peak'] if r['base_peak'] is not None else r['base_logits']) / 2**20:.0f}",
                "-",
                "-",
            )
        )
        lines.append(
            (
                r["model"],
                r["log"],
                "gaca, no prefix sharing",
                f"{r['wall_noshare']:.2f}",
                f"{r['fwd_noshare']:,}",
                f"{r['fwd_noshare'] / r['lower']:.2f}",
                f"{r['work'] / r['wall_noshare']:,.0f}",
                f"{r['base_wall'] / r['wall_noshare']:.1f}×",
                "1.0×",
                f"{r['floor']:.2f}",
                f"{r['wall_noshare'] / r['floor']:.1f}",
                "-",
                r["packed"],
                f"{r['diff_noshare']:.1e}",
            )
        )
        lines.append(
            (
                r["model"],
                r["log"],
                "gaca score",
                f"{r['wall']:.2f}",
                f"{r['fwd']:,}",
                f"{r['fwd'] / r['lower']:.2f}",
                f"{r['work'] / r['wall']:,.0f}",
                f"{r['base_wall'] / r['wall']:.1f}×",
                f"{r['wall_noshare'] / r['wall']:.1f}×",
                f"{r['floor']:.2f}",
                f"{r['wall'] / r['floor']:.1f}",
                f"{(r['peak'] if r['peak'] is not None else r['gaca_logits']) / 2**20:.0f}",
                r["packed"],
                f"{r['diff']:.1e}",
            )
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:{'<' if i < 3 else '>'}{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*head))
    print(fmt.format(*("-" * w for w in widths)))
    for line in lines:
        print(fmt.format(*line))
    print(
        "\nstep tok/s: Σ over steps of context + action tokens ÷ wall (the same work for both methods);\n"
        "floor: the task's FLOP floor, 2 × (body parameters × unique tokens + head parameters × action tokens)\n"
        "       ÷ measured matmul FLOP/s (the same for both methods; × floor = wall ÷ floor);\n"
        "× bound: tokens forwarded ÷ the log's distinct tokens (each distinct prefix of context + action once);\n"
        "logits MB: the largest float32 logits tensor built (on CUDA: each method's measured peak allocation\n"
        "       above the resident model, torch.cuda.max_memory_allocated)."
    )


if __name__ == "__main__":
    main()
