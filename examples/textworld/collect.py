"""Collect a gaca log from TextWorld games: generate games offline, play grouped rollouts.

    python examples/textworld/collect.py -o /tmp/tw.parquet                      # scripted policy
    python examples/textworld/collect.py --games 8 --rollouts 8 --epsilon 0.4 -o tw.parquet
    python examples/textworld/collect.py --model ./my-model -o tw_lm.parquet    # a causal LM

Games are compiled once into --games-dir (default examples/textworld/games/, gitignored) by
TextWorld's own generator, seeded by --first-game-seed .. +--games-1; no network is used.
Each game is one episode group ("<game>@<seed>") of --rollouts rollouts. The log follows
log-schema.md (see gaca_cli/demo/textworld_games.py for what each column holds) and passes
`gaca validate`; the summary goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from gaca_cli.demo import textworld_games as tw  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", type=Path, required=True, help="Parquet log to write")
    p.add_argument("--games", type=int, default=4, help="number of games (episode groups)")
    p.add_argument("--first-game-seed", type=int, default=0, help="generation seed of the first game")
    p.add_argument("--rooms", type=int, default=3)
    p.add_argument("--objects", type=int, default=4)
    p.add_argument("--quest-length", type=int, default=3)
    p.add_argument("--games-dir", type=Path, default=HERE / "games", help="cache of compiled games")
    p.add_argument("--rollouts", type=int, default=8, help="rollouts per game")
    p.add_argument("--max-steps", type=int, default=12, help="step budget of a rollout")
    p.add_argument("--seed", type=int, default=0, help="collection seed (part of group_id)")
    p.add_argument("--epsilon", type=float, default=0.3, help="scripted policy: exploration rate")
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="scripted policy: tokenizer directory, to write action/prompt token ids",
    )
    p.add_argument("--model", type=Path, default=None, help="causal LM directory: sample commands with it")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    return p


def make_policy(args):
    if args.model is not None:
        return tw.LMPolicy(args.model, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    return tw.ScriptedPolicy(epsilon=args.epsilon, seed=args.seed, tokenizer=tokenizer)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import pyarrow.parquet as pq

    start = time.perf_counter()
    specs = tw.game_specs(
        args.games, args.first_game_seed, rooms=args.rooms, objects=args.objects, quest_length=args.quest_length
    )
    games = [(s.name, tw.make_game(s, args.games_dir)) for s in specs]
    made = time.perf_counter()
    policy = make_policy(args)
    table = tw.collect(
        games,
        policy,
        args.rollouts,
        args.max_steps,
        args.seed,
        progress=lambda done, total: print(f"\rplayed {done}/{total} games", end="", file=sys.stderr),
    )
    print(file=sys.stderr)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(args.output.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(args.output)
    n_traj = table.num_rows and len(set(table["traj_id"].to_pylist()))
    print(
        f"wrote {table.num_rows} steps, {n_traj} rollouts of {len(games)} games to {args.output}; "
        f"success rate {tw.success_rate(table):.3f}; policy {policy.name}; "
        f"games {made - start:.1f}s, play {time.perf_counter() - made:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
