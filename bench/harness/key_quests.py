"""Key quests: small TextWorld-like games written in Python, fast enough for experiments.

TextWorld's interpreter spends about 40 ms per step computing admissible commands and plans;
an experiment with hundreds of rollouts per iteration, several methods and seeds needs
thousands of times more steps than `gaca demo`. These games keep TextWorld's surface (rooms,
exits, objects, an inventory, the same `GameState` with admissible commands and an expert
plan) and run in microseconds, so the language model is the only cost.

The world of `QuestSpec(seed)` (deterministic given the spec):
* `rooms` rooms joined as a random tree; each link is a compass exit and its opposite.
* a chest in the room farthest from the start; its lock has a colour, named in the quest.
* a key rack in another room, holding `keys` keys: the first `keys` colours of `COLOURS` in
  a random order (so that a small model need not learn a large colour vocabulary); one
  matches the lock, whose colour is drawn among them.
  Taking a key from the rack is decisive: the rack releases one key and the others fall into
  a crack in the floor, so a wrong key loses the game on the spot ("lost").
* `distractors` objects spread over the rooms: they can be taken and dropped, to no effect.
* the treasure, one of the first `treasures` names of `TREASURES`.

The quest: "Find the <treasure>: it is in the chest with the <colour> lock." A walkthrough
is: walk to the rack, take the matching key, walk to the chest, unlock it, open it, take the
treasure (won, score 1). Moving, taking distractors, `look` and commands the game does not
know cost only a step of the budget; one step (the key) decides success. The expert plan of a
state is the shortest walkthrough from it; a lost or won game has none.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gaca_cli.demo.textworld_games import GameState

ROOM_NAMES = (
    "kitchen", "cellar", "attic", "library", "pantry", "hallway", "study", "garden",
    "bedroom", "bathroom", "workshop", "gallery", "chapel", "armoury", "vault", "porch",
)  # fmt: skip
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "silver", "purple")
TREASURES = ("gold coin", "ruby ring", "old map", "jade idol", "silver cup", "lost crown")
DISTRACTORS = (
    "wooden spoon", "torn book", "apple", "candle", "rope", "boot", "feather", "bottle",
    "hammer", "pillow", "teapot", "shell",
)  # fmt: skip
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


@dataclass(frozen=True)
class QuestSpec:
    """One key quest: its generation seed and sizes (see the module docstring)."""

    seed: int
    rooms: int = 5
    keys: int = 2
    distractors: int = 4
    treasures: int = 1

    def __post_init__(self) -> None:
        if not 3 <= self.rooms <= len(ROOM_NAMES):
            raise ValueError(f"QuestSpec.rooms must be in 3..{len(ROOM_NAMES)}, got {self.rooms}")
        if not 1 <= self.keys <= len(COLOURS):
            raise ValueError(f"QuestSpec.keys must be in 1..{len(COLOURS)}, got {self.keys}")
        if not 1 <= self.treasures <= len(TREASURES):
            raise ValueError(f"QuestSpec.treasures must be in 1..{len(TREASURES)}, got {self.treasures}")
        if not 0 <= self.distractors <= len(DISTRACTORS):
            raise ValueError(f"QuestSpec.distractors must be in 0..{len(DISTRACTORS)}, got {self.distractors}")

    @property
    def name(self) -> str:
        return f"kq-r{self.rooms}-k{self.keys}-d{self.distractors}-t{self.treasures}-g{self.seed}"

    def new_game(self) -> KeyQuest:
        return KeyQuest(build_world(self))


@dataclass(frozen=True)
class World:
    """The fixed layout of one quest; `KeyQuest` holds what changes while playing."""

    rooms: tuple[str, ...]
    exits: tuple[dict[str, int], ...]  # per room: direction -> room index
    start: int
    rack_room: int
    chest_room: int
    key_colours: tuple[str, ...]  # on the rack, in display order
    lock_colour: str
    treasure: str
    objects: tuple[tuple[str, int], ...]  # distractors: (name, room)

    @property
    def objective(self) -> str:
        return f"Find the {self.treasure}: it is in the chest with the {self.lock_colour} lock."


def build_world(spec: QuestSpec) -> World:
    rng = np.random.default_rng([spec.seed, spec.rooms, spec.keys, spec.distractors, spec.treasures])
    names = tuple(str(n) for n in rng.choice(ROOM_NAMES, size=spec.rooms, replace=False))
    exits: list[dict[str, int]] = [{} for _ in names]
    for room in range(1, spec.rooms):
        # attach to an earlier room that still has a free direction whose opposite is free here
        while True:
            other = int(rng.integers(room))
            free = [d for d in OPPOSITE if d not in exits[other]]
            if free:
                break
        direction = str(rng.choice(free))
        exits[other][direction] = room
        exits[room][OPPOSITE[direction]] = other
    depth = _distances(exits, 0)
    chest = int(np.argmax(depth))  # the farthest room (the first one on ties)
    rack = int(rng.choice([r for r in range(1, spec.rooms) if r != chest]))
    colours = tuple(str(c) for c in rng.permutation(COLOURS[: spec.keys]))  # always the first `keys` colours
    lock = colours[int(rng.integers(spec.keys))]
    treasure = TREASURES[int(rng.integers(spec.treasures))]
    objects = tuple(
        (str(n), int(rng.integers(spec.rooms))) for n in rng.choice(DISTRACTORS, size=spec.distractors, replace=False)
    )
    return World(names, tuple(exits), 0, rack, chest, colours, lock, treasure, objects)


def _distances(exits, source: int) -> list[int]:
    dist = [-1] * len(exits)
    dist[source] = 0
    queue = deque([source])
    while queue:
        here = queue.popleft()
        for there in exits[here].values():
            if dist[there] < 0:
                dist[there] = dist[here] + 1
                queue.append(there)
    return dist


def _first_move(exits, source: int, target: int) -> str:
    """The exit of `source` on the shortest path to `target` (source != target)."""
    back = {source: ""}
    queue = deque([source])
    while queue:
        here = queue.popleft()
        for direction in sorted(exits[here]):
            there = exits[here][direction]
            if there not in back:
                back[there] = back[here] or direction
                queue.append(there)
    return back[target]


@dataclass
class KeyQuest:
    """One running copy of a quest, with TextWorldGame's interface (reset, step, close)."""

    world: World
    room: int = 0
    carried: list[str] = field(default_factory=list)
    placed: dict[str, int] = field(default_factory=dict)  # distractor -> room (absent: carried)
    rack: tuple[str, ...] = ()  # colours still on the rack
    key: str | None = None  # colour of the key carried
    chest: str = "locked"  # locked | closed | open | empty
    won: bool = False
    lost: bool = False

    def reset(self) -> GameState:
        w = self.world
        self.room, self.carried, self.placed = w.start, [], dict(w.objects)
        self.rack, self.key, self.chest, self.won, self.lost = w.key_colours, None, "locked", False, False
        return self._state(self._description())

    def close(self) -> None:
        pass

    # -- what the player sees

    def _description(self) -> str:
        w = self.world
        exits = ", ".join(sorted(w.exits[self.room]))
        lines = [f"-= {w.rooms[self.room].title()} =-", f"Exits: {exits}."]
        if self.room == w.rack_room and self.rack:
            lines.append("A key rack holds " + ", ".join(f"a {c} key" for c in self.rack) + ".")
        if self.room == w.chest_room:
            state = {
                "locked": "locked",
                "closed": "closed",
                "open": f"open, with a {w.treasure} inside",
                "empty": "open and empty",
            }
            lines.append(f"A chest with a {w.lock_colour} lock stands here ({state[self.chest]}).")
        here = [name for name, room in self.placed.items() if room == self.room]
        if here:
            lines.append("On the floor: " + ", ".join(f"a {n}" for n in here) + ".")
        return "\n".join(lines)

    def _inventory(self) -> str:
        items = ([f"a {self.key} key"] if self.key else []) + [f"a {n}" for n in self.carried]
        return "You are carrying: " + ", ".join(items) + "." if items else "You are carrying nothing."

    def admissible(self) -> tuple[str, ...]:
        if self.won or self.lost:
            return ()
        w = self.world
        out = [f"go {d}" for d in sorted(w.exits[self.room])]
        if self.room == w.rack_room and self.key is None:
            out += [f"take {c} key" for c in self.rack]
        if self.room == w.chest_room:
            if self.chest == "locked" and self.key is not None:
                out.append(f"unlock chest with {self.key} key")
            if self.chest == "closed":
                out.append("open chest")
            if self.chest == "open":
                out.append(f"take {w.treasure}")
        out += [f"take {n}" for n, room in self.placed.items() if room == self.room]
        out += [f"drop {n}" for n in self.carried]
        return tuple(out + ["look", "inventory"])

    def expert(self) -> str | None:
        """The first command of the shortest walkthrough from here (None when finished)."""
        if self.won or self.lost:
            return None
        w = self.world
        if self.chest == "locked" and self.key is None:
            target, command = w.rack_room, f"take {w.lock_colour} key"
        elif self.chest == "locked":
            target, command = w.chest_room, f"unlock chest with {self.key} key"
        else:
            target, command = w.chest_room, ("open chest" if self.chest == "closed" else f"take {w.treasure}")
        return command if self.room == target else "go " + _first_move(w.exits, self.room, target)

    def _state(self, feedback: str) -> GameState:
        return GameState(
            feedback=feedback,
            description=self._description(),
            inventory=self._inventory(),
            admissible=self.admissible(),
            expert=self.expert(),
            score=int(self.won),
            won=self.won,
            lost=self.lost,
            objective=self.world.objective,
        )

    # -- what the player does

    def step(self, command: str) -> GameState:
        return self._state(self._apply(" ".join(command.lower().split())))

    def _apply(self, command: str) -> str:
        w = self.world
        if self.won or self.lost:
            return "The game is over."
        if command == "look":
            return self._description()
        if command == "inventory":
            return self._inventory()
        verb, _, rest = command.partition(" ")
        if verb == "go" and rest in w.exits[self.room]:
            self.room = w.exits[self.room][rest]
            return self._description()
        if verb == "take" and rest.endswith(" key") and self.room == w.rack_room and self.key is None:
            colour = rest.removesuffix(" key")
            if colour in self.rack:
                self.key, self.rack = colour, ()
                if colour != w.lock_colour:
                    self.lost = True
                    return f"You take the {colour} key; the other keys fall into a crack in the floor. *** You lost ***"
                return f"You take the {colour} key; the other keys fall into a crack in the floor."
        if verb == "take" and self.placed.get(rest) == self.room:
            del self.placed[rest]
            self.carried.append(rest)
            return f"You take the {rest}."
        if verb == "drop" and rest in self.carried:
            self.carried.remove(rest)
            self.placed[rest] = self.room
            return f"You drop the {rest}."
        if self.room == w.chest_room:
            if command == f"unlock chest with {self.key} key" and self.chest == "locked":
                self.chest = "closed"
                return "The lock clicks open."
            if command == "open chest" and self.chest == "closed":
                self.chest = "open"
                return f"You open the chest. Inside lies a {w.treasure}."
            if command == f"take {w.treasure}" and self.chest == "open":
                self.chest, self.won = "empty", True
                return f"You take the {w.treasure}. *** You won ***"
        return "You can't do that here."


def quest_specs(n_games: int, first_seed: int = 0, **options) -> list[QuestSpec]:
    return [QuestSpec(seed=first_seed + i, **options) for i in range(n_games)]


def walkthrough_length(spec: QuestSpec) -> int:
    """Steps of the expert's walkthrough (the shortest win)."""
    game = spec.new_game()
    state = game.reset()
    steps = 0
    while state.expert is not None:
        state = game.step(state.expert)
        steps += 1
    return steps
