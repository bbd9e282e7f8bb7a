"""Lightning callbacks that connect the trainer to a `RolloutService`."""

from lit_asyncrl.trainer_callbacks.find import rollouts_of
from lit_asyncrl.trainer_callbacks.rollout_stats import RolloutStatsLogger
from lit_asyncrl.trainer_callbacks.trained_episodes import TrainedEpisodesWriter
from lit_asyncrl.trainer_callbacks.weight_sync import EngineWeightSync

__all__ = ["EngineWeightSync", "RolloutStatsLogger", "TrainedEpisodesWriter", "rollouts_of"]
