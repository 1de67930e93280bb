"""GACA in a training loop of your own: plain PyTorch + transformers, no RL framework.

The recipe for any trainer gaca has no patch for (TRL, OpenRLHF, SkyRL, ...): roll out a
group of episodes per task, keep per step the ids (group, trajectory, step), the reward, the
state the step acted in (the anchor) and the action's NLL under the sampling policy, then
`gaca_cli.compute_advantages` gives each step its advantage, and a PPO-clip step uses it.

The environment is a toy: two turns per episode, the observation of turn 2 says whether the
first action mentioned "key", and the last action is rewarded for saying "open". It runs on
CPU with any small causal LM:

    python examples/custom_loop.py --model HuggingFaceTB/SmolLM2-135M-Instruct --iterations 20
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import gaca_cli as gaca

TASKS = ["You are in the hall. A brass key lies on the table.", "You are in the corridor. The door is locked."]


def observe(task: str, turn: int, previous: str) -> str:
    if turn == 0:
        return task
    return "You carry a brass key." if "key" in previous else "Your hands are empty."


def action_logprobs(model, prompt_ids: torch.Tensor, action_ids: torch.Tensor) -> torch.Tensor:
    """log π(a_k | prompt, a_<k) of each action token: [len(action)]."""
    ids = torch.cat([prompt_ids, action_ids]).unsqueeze(0)
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, action_ids.unsqueeze(-1)).squeeze(-1)


def rollout(model, tokenizer, group_size: int, max_new_tokens: int) -> list[dict]:
    """Every step of `group_size` episodes per task: one dict per step."""
    steps = []
    for g, task in enumerate(TASKS):
        for r in range(group_size):
            action = ""
            for turn in range(2):
                obs = observe(task, turn, action)
                chat = [{"role": "user", "content": obs}]
                prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
                prompt_ids = (prompt["input_ids"] if not isinstance(prompt, torch.Tensor) else prompt)[0]
                with torch.no_grad():
                    out = model.generate(
                        prompt_ids.unsqueeze(0),
                        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                        do_sample=True,
                        max_new_tokens=max_new_tokens,
                        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                    )
                    action_ids = out[0, len(prompt_ids) :]
                    old = action_logprobs(model, prompt_ids, action_ids)
                action = tokenizer.decode(action_ids, skip_special_tokens=True)
                reward = float("open" in action) if turn == 1 else 0.0
                steps.append(
                    {"group": g, "traj": f"{g}/{r}", "step": turn, "anchor": obs, "reward": reward}
                    | {"prompt_ids": prompt_ids, "action_ids": action_ids, "old": old}
                )
    return steps


def ppo_step(model, optimizer, steps: list[dict], advantage: torch.Tensor, clip: float = 0.2) -> float:
    """One PPO-clip update on every step's action tokens (token-mean loss)."""
    losses = []
    for s, a in zip(steps, advantage):
        if len(s["action_ids"]) == 0:
            continue
        ratio = torch.exp(action_logprobs(model, s["prompt_ids"], s["action_ids"]) - s["old"])
        losses.append(-torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + clip) * a))
    loss = torch.cat(losses).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach().item()


def train(model_name: str, iterations: int = 2, group_size: int = 4, max_new_tokens: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    model = AutoModelForCausalLM.from_pretrained(model_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    history = []
    for it in range(iterations):
        model.eval()
        steps = rollout(model, tokenizer, group_size, max_new_tokens)
        nll = [-float(s["old"].mean()) if len(s["old"]) else float("nan") for s in steps]
        columns = gaca.compute_advantages(
            group_id=np.array([s["group"] for s in steps]),
            traj_id=np.array([s["traj"] for s in steps]),
            step_idx=np.array([s["step"] for s in steps]),
            reward=torch.tensor([s["reward"] for s in steps]),  # a tensor in, tensors out
            anchor=np.array([s["anchor"] for s in steps]),
            nll=np.array(nll),
            method="gaca",
            beta=0.2,
        )
        model.train()
        loss = ppo_step(model, optimizer, steps, columns["advantage"])
        mean_reward = float(np.mean([s["reward"] for s in steps if s["step"] == 1]))
        history.append({"iteration": it, "loss": loss, "reward": mean_reward})
        print(f"iteration {it}: reward {mean_reward:.2f}  loss {loss:+.4f}", flush=True)
    return model, history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", required=True, help="a local directory or hub id of a causal LM with a chat template"
    )
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    train(args.model, args.iterations, args.group_size)


if __name__ == "__main__":
    main()
