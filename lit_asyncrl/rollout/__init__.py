"""The generation side of a run, behind one protocol (`RolloutService`).

The types other code talks to are named here: the service and the factory that makes it, the
engine protocol, the weight-route protocol and what a push took, the settings users write
(`rollout.<key>`), and the records a rollout yields.
What implements them lives in packages by concern:

- `serving/`: the service on vLLM engines and what coordinates it (lanes, placement, DDP, held-out
  evaluation, start-up checks, statistics);
- `episodes/`: the episode runner and the formats that turn an episode into tokens;
- `queue/`: the producer, the buffer of finished groups and its filters;
- `engine/`: the vLLM engine in this process and its settings;
- `weights/`: the routes by which a version's weights reach an engine;
- `processes/`: the hygiene of the engine's processes (temp dirs, reaper, vLLM plugins);
- `ray_actors/`: engines and workers as Ray actors;
- `old_logits/`: exact pi_old for tokens still in the system (scoring, the dedicated worker).
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lit_asyncrl.rollout.engine.protocol import Engine, EngineDeadError, TurnOutput
    from lit_asyncrl.rollout.engine.settings import EngineSettings
    from lit_asyncrl.rollout.episodes.scripted import ScriptedPlay, play_scripted
    from lit_asyncrl.rollout.records import Trajectory
    from lit_asyncrl.rollout.service import RolloutService, RolloutServiceError, ScoreFn, ServiceFactory
    from lit_asyncrl.rollout.settings import RolloutConfig
    from lit_asyncrl.rollout.weights.route import WeightPush, WeightRoute

#: Each public name and the module that defines it. They are imported when first asked for, not with
#: the package: the reaper (`python -m lit_asyncrl.rollout.processes.reaper`) and the vLLM plugins of
#: `processes/` import this package in processes that must start without torch or transformers.
_PUBLIC = {
    "Engine": "lit_asyncrl.rollout.engine.protocol",
    "EngineDeadError": "lit_asyncrl.rollout.engine.protocol",
    "TurnOutput": "lit_asyncrl.rollout.engine.protocol",
    "EngineSettings": "lit_asyncrl.rollout.engine.settings",
    "ScriptedPlay": "lit_asyncrl.rollout.episodes.scripted",
    "play_scripted": "lit_asyncrl.rollout.episodes.scripted",
    "Trajectory": "lit_asyncrl.rollout.records",
    "RolloutService": "lit_asyncrl.rollout.service",
    "RolloutServiceError": "lit_asyncrl.rollout.service",
    "ScoreFn": "lit_asyncrl.rollout.service",
    "ServiceFactory": "lit_asyncrl.rollout.service",
    "RolloutConfig": "lit_asyncrl.rollout.settings",
    "WeightPush": "lit_asyncrl.rollout.weights.route",
    "WeightRoute": "lit_asyncrl.rollout.weights.route",
}

__all__ = [
    "Engine",
    "EngineSettings",
    "EngineDeadError",
    "RolloutConfig",
    "RolloutService",
    "RolloutServiceError",
    "ScoreFn",
    "ScriptedPlay",
    "ServiceFactory",
    "Trajectory",
    "TurnOutput",
    "WeightPush",
    "WeightRoute",
    "play_scripted",
]


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
