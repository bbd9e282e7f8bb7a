"""GEM (gem-llm 0.1.0) text games as an `Environment`: `env=gem env.env_id=game:Mastermind-v0-easy`.

Needs the `gem` extra (`pip install -e ".[gem]"`); selecting it without the extra fails in
`__init__` with an error naming the extra. The module itself imports without gem.

Instances are seeds: a game draws its secret from `reset(seed)`, so the seed is the task. The seed
an engine passes to an episode's `reset` is ignored (the instance fixes the game; all episodes of a
group play the same game, with the same in-game randomness for the same actions).

Held-out split: the key of an instance is the game's hidden state right after `reset(seed)`, read
from the gem env object (Mastermind: the code, GuessTheNumber: the number, Sudoku / FifteenPuzzle:
the board, Sokoban: the room, Wordle / Hangman: the word, `rg:*`: the question), with the game's
settings. Seeds that deal the same game share a key, so evaluation games are never trained on.
The other games are keyed on the seed: their evaluation seeds are never trained on, but an
evaluation game may repeat a training game. That covers games whose hidden state is drawn during
play (Minesweeper places its mines at the first reveal, Game2048 spawns tiles after each move),
WordSearch and Crosswords, and TowerofHanoi, whose puzzle is fixed by its settings (one puzzle per
id except -random: evaluation replays the training puzzle). Small games have few distinct games:
Mastermind-v0-easy has 30 codes and GuessTheNumber-v0-easy 10 numbers, so their held-out splits are
a handful of games (by the stable hash: 3 codes and 5 numbers at `held_out_fraction=0.2`).

Turns: gem parses actions from `\\boxed{...}` (the last match); the default `turn_stop` is `}`, so an
agent turn is e.g. `\\boxed{1 2}` and gem receives it whole. Observations are gem's own texts, each
framed by newlines (`"\\n" + text + "\\n"`) so turns read as lines; gem's rewards pass through
unchanged (format error -0.1 and the episode ends; progress rewards, e.g. Mastermind's new black
pegs / code length). Board games show their board only in gem's `info["suffix"]` (what gem's
observation wrappers append, e.g. "Current board: ... Enter your move."): `append_suffix` adds it
after each observation, by default for every game but Mastermind, GuessTheNumber and Wordle, whose
suffix is a fixed "Enter your guess.".

Success: a `game:*` episode succeeds when the game ends with its own win message (every gem game
answers a win with an observation starting `Congratulations!`; losses, turn limits and format
errors never do, even when their reward is positive, e.g. GuessTheNumber's distance reward at the
turn limit). For other ids (`rg:*`, single-turn, scored 0..1) success is a reward of 1.

Instructions: gem's instruction texts are long (Mastermind-v0-easy 659 characters, GuessTheNumber
550). `instructions="compact"` replaces them with a short text for Mastermind and GuessTheNumber
(the game's own observations stay); any other text is used as a template formatted with the game's
attributes (e.g. `"Guess {min_number}-{max_number} as \\\\boxed{{n}}.\\n"`).

Characters: the games' texts are printable ASCII and newlines (the built-in character tokenizer
covers them), except Sokoban's board (`√` marks a box on a target). gem's `rg:*` terminal
observation, `<|TERMINAL_STATE|>` written with full-width bars, is replaced by an empty one.

Offline in gem-llm 0.1.0: Mastermind, GuessTheNumber, Minesweeper, Sudoku, FifteenPuzzle (not
-random: a gem bug), TowerofHanoi, Game2048, Sokoban (-hard and -random generate rooms for
seconds per reset) and `rg:*`. Wordle, Hangman and WordSearch download nltk data, Crosswords needs
pandas and data: they fail in `__init__`.

Thread safety: every call into gem holds one process-wide lock, and each episode keeps its own copy
of the global `random` / `numpy.random` state (`lit_asyncrl.envs.adapters.global_rng`), since gem reseeds and
draws from them: concurrent episodes play exactly as they would alone.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from lit_asyncrl.envs.adapters.gem_solvers import SOLVERS
from lit_asyncrl.envs.adapters.global_rng import GlobalRandomState, preserved_global_random
from lit_asyncrl.envs.base import Environment, Transition

#: Every gem game's win message starts with this (checked against the gem-llm 0.1.0 sources).
WIN_PREFIX = "Congratulations!"

#: Attributes of a gem env that hold its hidden state (and settings) right after `reset(seed)`.
HIDDEN_STATE: dict[str, tuple[str, ...]] = {
    "MastermindEnv": ("code_length", "num_numbers", "duplicate_numbers", "max_turns", "game_code"),
    "GuessTheNumberEnv": ("min_number", "max_number", "max_turns", "game_number"),
    "FifteenPuzzleEnv": ("num_rows", "max_turns", "board"),
    "SudokuEnv": ("scale", "clues", "max_turns", "board"),
    "SokobanEnv": ("dim_room", "num_boxes", "max_turns", "room_fixed", "room_state"),
    "WordleEnv": ("word_length", "max_turns", "secret_word"),
    "HangmanEnv": ("word_length", "max_turns", "secret_word"),
}


def _mastermind_compact(game: Any) -> str:
    repeats = "repeats allowed" if game.duplicate_numbers else "no repeats"
    example = " ".join(str(digit) for digit in range(1, game.code_length + 1))
    return (
        f"Mastermind: find the {game.code_length}-digit code, digits 1-{game.num_numbers}, {repeats}, "
        f"in {game.max_turns} guesses. Guess like \\boxed{{{example}}}. "
        "Black peg: right digit, right place. White peg: right digit, wrong place.\n"
    )


def _guess_the_number_compact(game: Any) -> str:
    return (
        f"Guess the number from {game.min_number} to {game.max_number} in {game.max_turns} guesses. "
        f"Guess like \\boxed{{{game.min_number}}}. Hints say higher or lower.\n"
    )


#: Short instruction texts (`instructions="compact"`), by gem env class.
COMPACT_INSTRUCTIONS: dict[str, Callable[[Any], str]] = {
    "MastermindEnv": _mastermind_compact,
    "GuessTheNumberEnv": _guess_the_number_compact,
}

#: Default turn cap of `*-random` ids (above every gem 0.1.0 game's own limit, at most 64).
RANDOM_VARIANT_MAX_TURNS = 100

#: Games whose `info["suffix"]` is a fixed prompt, not state: not appended by default.
FIXED_SUFFIX = frozenset({"MastermindEnv", "GuessTheNumberEnv", "WordleEnv"})


def import_gem() -> Any:
    """The `gem` package, or an ImportError naming the extra that installs it."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    level = root.level
    try:
        import gem
    except ImportError as error:
        raise ImportError("env=gem needs the 'gem' extra: pip install -e \".[gem]\"") from error
    finally:
        # `import gem` calls logging.basicConfig(level=INFO): keep the process's logging as it was.
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    return gem


class GemEpisode:
    """One play of a gem game (`reset` makes the gem env; every call runs in the episode's own RNG state)."""

    def __init__(self, owner: GemEnv, seed: int) -> None:
        self.owner = owner
        self.seed = seed
        self.rng_state = GlobalRandomState(seed)
        self.game: Any = None

    def reset(self, seed: int | None = None) -> str:
        """The game's instructions (or the configured ones). `seed` is ignored: the instance fixes the game."""
        with self.rng_state.active():
            game = self.owner.make_game()
            observation, info = game.reset(seed=self.seed)
            self.game = game
            return self.owner.first_observation(game, observation, info)

    def step(self, action: str) -> Transition:
        if self.game is None:
            raise RuntimeError("GemEpisode.step before reset")
        with self.rng_state.active():
            observation, reward, terminated, truncated, info = self.game.step(action)
        return self.owner.transition(observation, float(reward), bool(terminated), bool(truncated), info)

    def close(self) -> None:
        self.game = None


class GemEnv(Environment):
    """A gem environment (`gem.make(env_id)`); see the module docstring for instances, success and the split.

    Args:
        env_id: a gem id, e.g. `game:Mastermind-v0-easy`, `game:GuessTheNumber-v0-easy` (offline:
            the `game:*` ids except Wordle, Hangman, WordSearch and Crosswords, which need nltk
            data, and the `rg:*` ids; `math:*`, `qa:*` and `code:*` load hub datasets).
        env_kwargs: extra keyword arguments for `gem.make` (e.g. `{code_length: 3}`).
        max_turns: agent turns per episode; None = the game's own limit (100 for `*-random` ids,
            which draw their limit per episode; the game still ends the episode at its own limit).
        turn_stop: the text that ends an agent turn (one token of the policy's tokenizer); `}`
            closes `\\boxed{...}`.
        max_turn_tokens: most tokens per agent turn (32 characters hold the games' `\\boxed{...}`
            answers; raise it for policies that reason before answering).
        instructions: "full" (gem's text), "compact" (a short text; Mastermind and GuessTheNumber),
            or a template formatted with the game's attributes.
        append_suffix: add gem's `info["suffix"]` (the board of board games) after each
            observation; None = for every game but Mastermind, GuessTheNumber and Wordle.
        held_out_fraction: share of the games (by instance key) kept for evaluation.
        latency_s, episode_timeout_s: see `Environment`.
    """

    def __init__(
        self,
        env_id: str = "game:Mastermind-v0-easy",
        env_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        turn_stop: str = "}",
        max_turn_tokens: int = 32,
        instructions: str = "full",
        append_suffix: bool | None = None,
        held_out_fraction: float = 0.2,
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        import_gem()  # first: a missing extra fails before any work
        from gem.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            games = sorted(name for name in ENV_REGISTRY if name.startswith("game:"))
            raise ValueError(f"env.env_id={env_id!r} is not a gem environment; games: {', '.join(games)}")
        if not isinstance(turn_stop, str) or not turn_stop:
            raise ValueError(f"env.turn_stop must be a non-empty string, got {turn_stop!r}")
        if max_turn_tokens < 1:
            raise ValueError(f"env.max_turn_tokens must be >= 1, got {max_turn_tokens}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"env.max_turns must be >= 1 or null, got {max_turns}")
        if not 0.0 < held_out_fraction < 1.0:
            raise ValueError(f"env.held_out_fraction must be in (0, 1), got {held_out_fraction}")
        if not isinstance(instructions, str) or not instructions:
            raise ValueError(f"env.instructions must be 'full', 'compact' or a template, got {instructions!r}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.turn_stop = turn_stop
        self.max_turn_tokens = int(max_turn_tokens)
        self.instructions = instructions
        self.held_out_fraction = float(held_out_fraction)
        self._single_turn = not env_id.startswith("game:")
        # Settings and instance keys come from a probe game (every call restores the global RNGs).
        with preserved_global_random():
            probe = self.make_game()  # a bad id or a game that cannot run offline fails here
            probe.reset(seed=0)
        self._probe = probe
        self._game_class = type(probe).__name__
        if instructions == "compact" and self._game_class not in COMPACT_INSTRUCTIONS:
            raise ValueError(
                f"env.instructions=compact has no short text for {env_id} ({self._game_class}); "
                f"it has for {', '.join(sorted(COMPACT_INSTRUCTIONS))}: use 'full' or a template"
            )
        if instructions not in ("full", "compact"):
            try:
                instructions.format(**vars(probe))
            except (KeyError, IndexError, ValueError) as error:
                raise ValueError(
                    f"env.instructions={instructions!r} does not format with the game's attributes: {error!r}"
                ) from error
        self.append_suffix = self._game_class not in FIXED_SUFFIX if append_suffix is None else bool(append_suffix)
        self.max_turns = int(max_turns) if max_turns is not None else self._game_max_turns(probe)
        self._keys: dict[int, str] = {}

    # -- gem calls (always under LIBRARY_LOCK, via GlobalRandomState.active or preserved_global_random)

    def make_game(self) -> Any:
        return import_gem().make(self.env_id, **self.env_kwargs)

    def _game_max_turns(self, probe: Any) -> int:
        if self._single_turn:
            return 1
        if getattr(probe, "_is_random", False):
            return RANDOM_VARIANT_MAX_TURNS
        limit = getattr(probe, "max_turns", None)
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"{self.env_id} has no turn limit of its own; set env.max_turns")
        return limit

    # -- what the episodes show -----------------------------------------------------------------

    def first_observation(self, game: Any, observation: str, info: Mapping[str, Any]) -> str:
        if self.instructions == "compact":
            observation = COMPACT_INSTRUCTIONS[type(game).__name__](game)
        elif self.instructions != "full":
            observation = self.instructions.format(**vars(game))
        return observation + self._suffix(info)

    def transition(
        self, observation: str, reward: float, terminated: bool, truncated: bool, info: Mapping[str, Any]
    ) -> Transition:
        if self._single_turn:
            success = terminated and reward >= 1.0
            text = "" if "TERMINAL_STATE" in observation else f"\n{observation}\n"  # gem's rg:* end marker
        else:
            success = terminated and observation.startswith(WIN_PREFIX)
            text = f"\n{observation}\n" + ("" if terminated or truncated else self._suffix(info))
        return Transition(text, reward, terminated, truncated, {**info, "success": success})

    def _suffix(self, info: Mapping[str, Any]) -> str:
        suffix = info.get("suffix") if self.append_suffix else None
        return suffix.rstrip("\n") + "\n" if suffix else ""

    # -- the Environment protocol -----------------------------------------------------------------

    def generate_instance(self, rng: random.Random) -> int:
        return rng.randrange(2**31)

    def new_episode(self, instance: int) -> GemEpisode:
        return GemEpisode(self, int(instance))

    def instance_key(self, instance: int) -> str:
        """The game's hidden state after `reset(instance)` with its settings (or the seed; module docstring)."""
        key = self._keys.get(instance)
        if key is None:
            key = self._compute_key(int(instance))
            if len(self._keys) >= 100_000:
                self._keys.clear()
            self._keys[instance] = key
        return key

    def _compute_key(self, seed: int) -> str:
        prefix = self.env_id + (f" {sorted(self.env_kwargs.items())}" if self.env_kwargs else "")
        names = HIDDEN_STATE.get(self._game_class)
        if names is None and self._game_class != "ReasoningGymEnv":
            return f"{prefix} seed={seed}"
        # gem's reset(seed) reseeds the global generators first, so the probe needs no state of its
        # own; the games in HIDDEN_STATE reset completely, gem's rg env does not (a fresh one).
        with preserved_global_random():
            game = self._probe if names is not None else self.make_game()
            game.reset(seed=seed)
            if names is None:
                return f"{prefix} question={game.data['question']!r}"
            values = [getattr(game, name) for name in names]
        values = [value.tolist() if hasattr(value, "tolist") else value for value in values]
        return prefix + " " + " ".join(f"{name}={value!r}" for name, value in zip(names, values))

    def demonstration(self, instance: int) -> list[tuple[str, str]]:
        """A scripted win: Mastermind plays the first code consistent with all feedback, GuessTheNumber bisects.

        The pairs are what the env answered to the scripted actions (played on a fresh episode).
        """
        solver = SOLVERS.get(self._game_class)
        if solver is None:
            raise NotImplementedError(f"GemEnv has no scripted demonstration for {self.env_id}; set warm_start_steps=0")
        episode = self.new_episode(instance)
        episode.reset()
        play = solver(episode.game)
        turns: list[tuple[str, str]] = []
        feedback: str | None = None
        for _ in range(self.max_turns):
            try:
                guess = play.send(feedback) if turns else next(play)
            except StopIteration:
                break
            action = f"\\boxed{{{guess}}}"
            if not action.endswith(self.turn_stop):
                action += self.turn_stop
            result = episode.step(action)
            turns.append((action, result.observation))
            feedback = result.observation
            if result.done:
                break
        return turns
