"""Key quests: the generator's properties, the rules of play and the expert plan."""

from __future__ import annotations

import pytest

from bench.harness import key_quests as kq
from gaca_cli.demo import textworld_games as tw

SPECS = [
    kq.QuestSpec(seed=s, rooms=r, keys=k, distractors=d, treasures=t)
    for s in range(12)
    for r, k, d, t in ((3, 1, 0, 1), (5, 2, 4, 1), (8, 3, 6, 4))
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_worlds_are_connected_trees_with_the_chest_farthest_from_the_start(spec):
    w = kq.build_world(spec)
    assert len(set(w.rooms)) == spec.rooms
    links = [(a, b) for a, exits in enumerate(w.exits) for b in exits.values()]
    assert len(links) == 2 * (spec.rooms - 1)  # a tree: every link both ways, rooms − 1 links
    for a, exits in enumerate(w.exits):
        for direction, b in exits.items():
            assert w.exits[b][kq.OPPOSITE[direction]] == a
    depth = kq._distances(w.exits, w.start)
    assert min(depth) == 0 and depth[w.chest_room] == max(depth)
    assert w.rack_room not in (w.start, w.chest_room)
    assert sorted(w.key_colours) == sorted(kq.COLOURS[: spec.keys]) and w.lock_colour in w.key_colours
    assert w.treasure in kq.TREASURES[: spec.treasures]
    assert len({name for name, _ in w.objects}) == spec.distractors
    assert w.lock_colour in w.objective and w.treasure in w.objective


def test_generation_is_deterministic_and_seeds_differ():
    assert kq.build_world(kq.QuestSpec(3)) == kq.build_world(kq.QuestSpec(3))
    worlds = {repr(kq.build_world(kq.QuestSpec(s))) for s in range(20)}
    assert len(worlds) == 20


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_the_expert_plan_wins_in_the_shortest_number_of_steps(spec):
    """Walkthrough = path to the rack + take + path to the chest + unlock, open, take."""
    w = kq.build_world(spec)
    d_start = kq._distances(w.exits, w.start)
    d_rack = kq._distances(w.exits, w.rack_room)
    shortest = d_start[w.rack_room] + 1 + d_rack[w.chest_room] + 3
    game = spec.new_game()
    state = game.reset()
    steps = 0
    while state.expert is not None:
        assert state.expert in state.admissible
        state = game.step(state.expert)
        steps += 1
    assert state.won and not state.lost and state.score == 1 and state.admissible == ()
    assert steps == shortest == kq.walkthrough_length(spec)


def test_the_wrong_key_loses_at_once_and_unknown_commands_change_nothing():
    spec = next(s for s in SPECS if s.keys == 2)
    w = kq.build_world(spec)
    game = spec.new_game()
    state = game.reset()
    before = state
    state = game.step("dance wildly")
    assert state.feedback == "You can't do that here."
    assert (state.description, state.inventory, state.admissible) == (
        before.description,
        before.inventory,
        before.admissible,
    )
    while not state.expert.startswith("take") or "key" not in state.expert:
        state = game.step(state.expert)
    wrong = next(c for c in w.key_colours if c != w.lock_colour)
    assert f"take {wrong} key" in state.admissible
    state = game.step(f"take {wrong} key")
    assert state.lost and not state.won and state.finished and state.expert is None and state.score == 0


def test_distractors_can_be_taken_and_dropped_without_changing_the_plan():
    spec = kq.QuestSpec(seed=1, rooms=5, keys=2, distractors=12)
    game = spec.new_game()
    state = game.reset()
    here = [c for c in state.admissible if c.startswith("take ") and not c.endswith(" key")]
    assert here, "with 12 distractors in 5 rooms the start room holds one (seed 1)"
    plan = state.expert
    state = game.step(here[0])
    item = here[0].removeprefix("take ")
    assert f"a {item}" in state.inventory and f"drop {item}" in state.admissible and state.expert == plan
    state = game.step(f"drop {item}")
    assert "nothing" in state.inventory and state.expert == plan


def test_key_quests_play_through_the_rollout_loop():
    """collect_lockstep plays every group in one batch; the scripted expert wins every game,
    group ids carry the seed and each group holds the requested rollouts."""
    games = [(s.name, s) for s in kq.quest_specs(3, 0)]
    table = tw.collect_lockstep(games, tw.ScriptedPolicy(epsilon=0.0, seed=0), n_rollouts=2, max_steps=20, seed=7)
    assert tw.success_rate(table) == 1.0
    first = table.filter(table["step_idx"].to_numpy() == 0)
    assert sorted(set(first["group_id"].to_pylist())) == sorted(f"{name}@7" for name, _ in games)
    assert first.num_rows == 6
    noisy = tw.collect_lockstep(games, tw.ScriptedPolicy(epsilon=1.0, seed=0), n_rollouts=4, max_steps=6, seed=7)
    again = tw.collect_lockstep(games, tw.ScriptedPolicy(epsilon=1.0, seed=0), n_rollouts=4, max_steps=6, seed=7)
    assert noisy.equals(again)  # deterministic given the seed


def test_spec_validation():
    with pytest.raises(ValueError, match="rooms"):
        kq.QuestSpec(0, rooms=2)
    with pytest.raises(ValueError, match="keys"):
        kq.QuestSpec(0, keys=0)
    with pytest.raises(ValueError, match="treasures"):
        kq.QuestSpec(0, treasures=0)
    with pytest.raises(ValueError, match="distractors"):
        kq.QuestSpec(0, distractors=99)
