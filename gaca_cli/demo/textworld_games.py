"""TextWorld games → grouped rollouts → a gaca trajectory log (log-schema.md).

Everything `collect.py`, `bc.py` and `loop.py` share: offline game generation with fixed
seeds, an environment wrapper, the prompt template, two policies (a noisy scripted one and a
causal LM) and the rollout loop that writes one row per step.

The log's columns are those of examples/textworld/README.md. A group, `group_id` =
"<game>@<seed>", holds the rollouts of one game and collection seed: TextWorld games are
deterministic, so they all start from the same state. `anchor_obs` is the room description
and the inventory after the previous step (no history, no feedback text): equal text = same
room, same visible objects, same things carried. `prompt` is append-only: prompt[t] +
action[t] + "\n" is a prefix of prompt[t+1].
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: where compiled games are cached unless told otherwise
DEFAULT_GAMES_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gaca" / "textworld-games"

#: the chat template of the log's prompts (the same as tests/tiny_models.CHAT_TEMPLATE)
SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"
END_OF_TURN = "\n"
INSTRUCTIONS = "You play a text adventure. Reply with one command per turn."


# ---------------------------------------------------------------------------- games


@dataclass(frozen=True)
class GameSpec:
    """One generated game: TextWorld's `tw-make custom` options and its generation seed."""

    seed: int
    rooms: int = 3
    objects: int = 4
    quest_length: int = 3

    def __post_init__(self) -> None:
        for name in ("rooms", "objects", "quest_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"GameSpec.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def name(self) -> str:
        return f"tw-r{self.rooms}-o{self.objects}-q{self.quest_length}-g{self.seed}"


def make_game(spec: GameSpec, cache_dir: str | Path) -> Path:
    """Compile the game of `spec` into `cache_dir` (offline) unless it is there already."""
    import textworld

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{spec.name}.z8"
    if path.exists() and path.with_suffix(".json").exists():
        return path
    options = textworld.GameOptions()
    options.seeds = spec.seed
    options.nb_rooms = spec.rooms
    options.nb_objects = spec.objects
    options.chaining.min_length = spec.quest_length
    options.chaining.max_length = spec.quest_length
    options.chaining.max_depth = spec.quest_length
    options.path = str(path)
    options.file_ext = ".z8"
    options.force_recompile = True
    game_file, _ = textworld.make(options)
    return Path(game_file)


def game_specs(n_games: int, first_seed: int = 0, **options) -> list[GameSpec]:
    return [GameSpec(seed=first_seed + i, **options) for i in range(n_games)]


# ---------------------------------------------------------------------------- environment


_TRAILING_PROMPT = re.compile(r"\s*>\s*$")
_BLANK_LINES = re.compile(r"\n\s*\n+")


def clean_text(text: str) -> str:
    """Feedback without the trailing '>' prompt, banners' blank lines and edge whitespace."""
    text = _TRAILING_PROMPT.sub("", text or "")
    return _BLANK_LINES.sub("\n", text).strip()


@dataclass(frozen=True)
class GameState:
    feedback: str  # what the game printed after the last command (cleaned)
    description: str  # the current room's description (`look`), cleaned
    inventory: str
    admissible: tuple[str, ...]
    expert: str | None  # first command of TextWorld's plan from this state, if any
    score: int
    won: bool
    lost: bool
    objective: str

    @property
    def anchor(self) -> str:
        """The step's anchor observation: room description + inventory, without history."""
        return f"{self.description}\n{self.inventory}"

    @property
    def finished(self) -> bool:
        return self.won or self.lost


class TextWorldGame:
    """One running copy of a compiled game (TextWorld's own interpreter, no network)."""

    def __init__(self, path: str | Path):
        import textworld

        wanted = "admissible_commands policy_commands description inventory won lost score objective feedback"
        infos = textworld.EnvInfos(**dict.fromkeys(wanted.split(), True))
        self.env = textworld.start(str(path), request_infos=infos)

    def _state(self, gs) -> GameState:
        plan = list(gs.policy_commands or [])
        return GameState(
            feedback=clean_text(gs.feedback),
            description=clean_text(gs.description),
            inventory=clean_text(gs.inventory),
            admissible=tuple(gs.admissible_commands or ()),
            expert=plan[0] if plan else None,
            score=int(gs.score or 0),
            won=bool(gs.won),
            lost=bool(gs.lost),
            objective=(gs.objective or "").strip(),
        )

    def reset(self) -> GameState:
        return self._state(self.env.reset())

    def step(self, command: str) -> GameState:
        gs, _, _ = self.env.step(command)
        return self._state(gs)

    def close(self) -> None:
        self.env.close()


_NOT_PRINTABLE_ASCII = re.compile(r"[^ -\[\]-~]+")  # printable ASCII except the backslash
MAX_COMMAND_CHARS = 80


def game_command(action: str) -> str:
    """The command sent to the game for a policy's text: printable ASCII only (TextWorld's
    interpreter crashes on other characters), whitespace collapsed, at most 80 characters;
    an action with nothing left becomes "look"."""
    command = " ".join(_NOT_PRINTABLE_ASCII.sub(" ", action).split())[:MAX_COMMAND_CHARS].strip()
    return command or "look"


def first_observation(state: GameState) -> str:
    """The first user turn: the quest, the room and the inventory (TextWorld's banner dropped)."""
    return f"{state.objective}\n{state.description}\n{state.inventory}"


# ---------------------------------------------------------------------------- transcript


@dataclass
class Transcript:
    """The append-only chat of one rollout, as text and (with a tokenizer) as token ids.

    text = <|system|>S\\n<|user|>O_0\\n<|assistant|>A_0\\n<|user|>O_1\\n<|assistant|>…
    ids  = the same, built by appending: ids[t+1] = ids[t] + action ids + tokens of the next
           user turn, so that each step's context is exactly what the policy was given.
    """

    tokenizer: Any = None  # a transformers tokenizer, or None for text-only transcripts
    messages: list[dict] = field(default_factory=list)
    text: str = ""
    ids: list[int] | None = None

    def _append(self, piece: str) -> None:
        self.text += piece
        if self.tokenizer is not None:
            self.ids = (self.ids or []) + self.tokenizer.encode(piece, add_special_tokens=False)

    def start(self, system: str, observation: str) -> None:
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": observation}]
        self._append(f"{SYSTEM}{system}{END_OF_TURN}{USER}{observation}{END_OF_TURN}{ASSISTANT}")

    def add_action(self, action: str, token_ids: list[int] | None, ends_turn: bool) -> None:
        """`token_ids` are the action's own tokens; `ends_turn` says whether they already end
        with the end-of-turn token (an LM that stopped), else it is appended here."""
        self.messages.append({"role": "assistant", "content": action})
        self.text += action + END_OF_TURN
        if self.tokenizer is not None:
            assert token_ids is not None
            tail = [] if ends_turn else self.tokenizer.encode(END_OF_TURN, add_special_tokens=False)
            self.ids = list(self.ids or []) + list(token_ids) + tail

    def add_observation(self, observation: str) -> None:
        self.messages.append({"role": "user", "content": observation})
        self._append(f"{USER}{observation}{END_OF_TURN}{ASSISTANT}")


# ---------------------------------------------------------------------------- policies


@dataclass(frozen=True)
class Decision:
    """One policy output. `action` is logged as produced; `command` is what the game receives.
    `token_ids` (None without a tokenizer) and `logprobs` (one per action token) are aligned."""

    action: str
    command: str
    logprobs: list[float]
    token_ids: list[int] | None = None
    ends_turn: bool = False


class Policy(Protocol):
    """Chooses one action for each of a batch of rollouts that are at the same step.

    `states[i]` is rollout i's current game state and `transcripts[i]` its history (its
    `text`/`ids` are the exact context). Implementations must be deterministic given their
    seed and must return the true log-probabilities of what they chose.
    """

    name: str
    tokenizer: Any  # a transformers tokenizer, or None for policies that choose text

    def act(self, states: list[GameState], transcripts: list[Transcript]) -> list[Decision]: ...

    def reseed(self, seed: int) -> None: ...


class ScriptedPolicy:
    """ε-greedy between TextWorld's plan and the admissible commands.

    With probability 1 − ε play the first command of the plan from the current state, else a
    command drawn uniformly from the admissible ones, so
        π(a | s) = (1 − ε)·[a = expert(s)] + ε·[a ∈ A(s)] / |A(s)|
    (uniform over A(s) when the plan is empty). A whole command is one choice: its
    log-probability goes to the first action token and every later token gets 0.0 (the sum over
    tokens is log π(a | s)). Tokens are those of `tokenizer` when given (plus the end-of-turn
    token), else the command's whitespace-separated words (and no `action_token_ids`).
    """

    def __init__(self, epsilon: float = 0.3, seed: int = 0, tokenizer=None):
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.epsilon = epsilon
        self.tokenizer = tokenizer
        self.name = f"scripted-eps{epsilon:g}"
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def probability(self, state: GameState, command: str) -> float:
        options = state.admissible
        expert = state.expert
        if expert is None:
            return 1.0 / len(options) if command in options else 0.0
        p = (1.0 - self.epsilon) * (command == expert)
        if options:
            p += self.epsilon * (command in options) / len(options)
        elif command == expert:
            p += self.epsilon
        return p

    def _choose(self, state: GameState) -> str:
        options = state.admissible
        if state.expert is not None and (not options or self.rng.random() >= self.epsilon):
            return state.expert
        if not options:
            return "look"
        return options[int(self.rng.integers(len(options)))]

    def act(self, states: list[GameState], transcripts: list[Transcript]) -> list[Decision]:
        out = []
        for state in states:
            command = self._choose(state)
            p = self.probability(state, command)
            logp = math.log(p) if p > 0 else 0.0  # p == 0 only for the "look" fallback
            if self.tokenizer is not None:
                ids = self.tokenizer.encode(command + END_OF_TURN, add_special_tokens=False)
                out.append(Decision(command, command, [logp] + [0.0] * (len(ids) - 1), ids, ends_turn=True))
            else:
                n = max(1, len(command.split()))
                out.append(Decision(command, command, [logp] + [0.0] * (n - 1)))
        return out


class LMPolicy:
    """A causal LM samples each command after the transcript's token ids.

    Sampling runs `model.generate` (do_sample, temperature T, no top-k/top-p) until the
    end-of-turn token "\\n" or `max_new_tokens`; `behavior_logprobs` are log_softmax of the
    scores generate sampled from (logits / T after every active processor), so they are the
    true sampling distribution. The rollouts of a batch are sampled together (left padding).
    """

    def __init__(
        self,
        model_dir: str | Path,
        temperature: float = 1.0,
        max_new_tokens: int = 16,
        seed: int = 0,
        device: str = "cpu",
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model = model.to(device)  # type: ignore[arg-type]  # transformers' stubs type .to() as a decorator
        self.model.eval()
        self.device = device
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.name = str(model_dir)
        eot = self.tokenizer.encode(END_OF_TURN, add_special_tokens=False)
        if len(eot) != 1:
            raise ValueError(f"the tokenizer of {model_dir} must encode '\\n' as one token, got {eot}")
        self.eot_id = eot[0]
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eot_id
        self.generator_seed = seed

    def reseed(self, seed: int) -> None:
        self.generator_seed = seed

    def act(self, states: list[GameState], transcripts: list[Transcript]) -> list[Decision]:
        from transformers import GenerationConfig

        torch = self.torch
        config = GenerationConfig(
            do_sample=True,
            temperature=self.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.eot_id,
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        # one left-padded batch (positions follow the attention mask, so each row's scores
        # equal those of the same context unpadded, to float32 rounding)
        contexts = [list(t.ids or []) for t in transcripts]  # LM transcripts always hold token ids
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[self.pad_id] * (width - len(c)) + c for c in contexts], device=self.device)
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=self.device)
        torch.manual_seed(self.generator_seed)
        self.generator_seed += 1
        with torch.no_grad():
            result = self.model.generate(ids, attention_mask=mask, generation_config=config)
        logprobs_all = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in result.scores], dim=1)
        out = []
        for row in range(len(contexts)):
            new = result.sequences[row, width:].tolist()
            if self.eot_id in new:
                new = new[: new.index(self.eot_id) + 1]
            logprobs = [float(logprobs_all[row, k, tok]) for k, tok in enumerate(new)]
            ends_turn = bool(new) and new[-1] == self.eot_id
            body = new[:-1] if ends_turn else new
            action = str(self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False))
            out.append(Decision(action, game_command(action), logprobs, new, ends_turn=ends_turn))
        return out


# ---------------------------------------------------------------------------- rollouts


def open_game(game: str | Path | Any):
    """A running game: `game.new_game()` for a generated game (e.g. `key_quests.QuestSpec`),
    else TextWorld's interpreter on the compiled game file at path `game`."""
    new_game = getattr(game, "new_game", None)
    return new_game() if callable(new_game) else TextWorldGame(game)


def play_groups(groups: list[tuple[Any, str, str]], policy: Policy, n_rollouts: int, max_steps: int) -> list[dict]:
    """Play `n_rollouts` copies of each (game, group_id, task_id) all in lockstep, so that the
    policy chooses the actions of every live rollout of every group in one batch; return one
    row dict per step, trajectory by trajectory (groups in order)."""
    slots = [(game, group_id, task_id, k) for game, group_id, task_id in groups for k in range(n_rollouts)]
    games = [open_game(game) for game, *_ in slots]
    try:
        states = [g.reset() for g in games]
        transcripts = []
        for s in states:
            t = Transcript(tokenizer=policy.tokenizer)
            t.start(INSTRUCTIONS, first_observation(s))
            transcripts.append(t)
        rows: list[list[dict]] = [[] for _ in slots]
        live = list(range(len(slots)))
        for step in range(max_steps):
            if not live:
                break
            decisions = policy.act([states[i] for i in live], [transcripts[i] for i in live])
            still = []
            for i, d in zip(live, decisions):
                before = states[i]
                _, group_id, _, k = slots[i]
                row = {
                    "group_id": group_id,
                    "traj_id": f"{group_id}/r{k}",
                    "step_idx": step,
                    "prompt": transcripts[i].text,
                    "messages": [dict(m) for m in transcripts[i].messages],
                    "action": d.action,
                    "command": d.command,
                    "anchor_obs": before.anchor,
                    "observation": before.feedback if step else first_observation(before),
                    "is_action_valid": d.command in before.admissible,
                    "expert_command": before.expert,
                    "behavior_logprobs": d.logprobs,
                }
                if policy.tokenizer is not None:
                    row["prompt_token_ids"] = list(transcripts[i].ids or [])
                    row["action_token_ids"] = list(d.token_ids or [])
                after = games[i].step(d.command)
                states[i] = after
                row["reward"] = float(after.score - before.score)
                row["done"] = after.finished
                rows[i].append(row)
                transcripts[i].add_action(d.action, d.token_ids, d.ends_turn)
                if after.finished:
                    continue
                transcripts[i].add_observation(after.feedback)
                still.append(i)
            live = still
        out = []
        for i, traj in enumerate(rows):
            won = states[i].won
            ret = float(sum(r["reward"] for r in traj))
            for r in traj:
                r.update(
                    success=won,
                    truncated=not traj[-1]["done"],
                    episode_reward=ret,
                    task_id=slots[i][2],
                    policy_version=policy.name,
                    source="textworld",
                )
            out.extend(traj)
        return out
    finally:
        for g in games:
            g.close()


def log_schema(with_token_ids: bool) -> pa.Schema:
    chat = pa.list_(pa.struct([("role", pa.string()), ("content", pa.large_string())]))
    fields = [
        ("group_id", pa.string()),
        ("traj_id", pa.string()),
        ("step_idx", pa.int32()),
        ("prompt", pa.large_string()),
        ("messages", chat),
        ("action", pa.large_string()),
        ("command", pa.string()),
        ("anchor_obs", pa.large_string()),
        ("observation", pa.large_string()),
        ("reward", pa.float64()),
        ("done", pa.bool_()),
        ("truncated", pa.bool_()),
        ("success", pa.bool_()),
        ("episode_reward", pa.float64()),
        ("is_action_valid", pa.bool_()),
        ("expert_command", pa.string()),
        ("behavior_logprobs", pa.list_(pa.float32())),
    ]
    if with_token_ids:
        fields += [("prompt_token_ids", pa.list_(pa.int32())), ("action_token_ids", pa.list_(pa.int32()))]
    fields += [("task_id", pa.string()), ("policy_version", pa.string()), ("source", pa.string())]
    return pa.schema(fields)


def collect(
    game_paths: list[tuple[str, Any]],
    policy: Policy,
    n_rollouts: int,
    max_steps: int,
    seed: int,
    progress=None,
) -> pa.Table:
    """Play every (name, game) pair `n_rollouts` times; group_id = "<name>@<seed>"; a game is
    a compiled TextWorld file or a generated game (see `open_game`).

    The policy is reseeded per group from (seed, group index), so a group's rollouts do not
    depend on which other groups are collected in the same run.
    """
    rows: list[dict] = []
    for g, (name, path) in enumerate(game_paths):
        policy.reseed(seed * 1_000_003 + g * 7_919)
        rows.extend(play_groups([(path, f"{name}@{seed}", name)], policy, n_rollouts, max_steps))
        if progress is not None:
            progress(g + 1, len(game_paths))
    return pa.Table.from_pylist(rows, schema=log_schema(policy.tokenizer is not None))


def success_rate(table: pa.Table) -> float:
    """Fraction of trajectories that won their game."""
    first = table.filter(pc.equal(table["step_idx"], 0))
    return float(np.mean(first["success"].to_numpy(zero_copy_only=False))) if first.num_rows else float("nan")


def collect_lockstep(
    games: list[tuple[str, Any]], policy: Policy, n_rollouts: int, max_steps: int, seed: int
) -> pa.Table:
    """As `collect`, but every rollout of every game is played in one lockstep batch (one
    `policy.act` call per step for all of them: much faster for a language model on CPU).
    The policy is seeded once from `seed`, so a group's rollouts depend on the other games
    of the call; group_id = "<name>@<seed>"."""
    policy.reseed(seed)
    groups = [(game, f"{name}@{seed}", name) for name, game in games]
    rows = play_groups(groups, policy, n_rollouts, max_steps)
    return pa.Table.from_pylist(rows, schema=log_schema(policy.tokenizer is not None))
