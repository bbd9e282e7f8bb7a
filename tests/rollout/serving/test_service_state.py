"""A checkpoint keeps the rollout service's state through the protocol (`state_dict`), and a
checkpoint written before the service had one (`rollout_accounting`) still resumes."""

from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.rollout.settings import RolloutConfig

SMALL = {"rollout": RolloutConfig.from_keys(groups_per_batch=4, group_size=2, buffer_capacity=16)}


def datamodule_after_a_run() -> RolloutDataModule:
    data = RolloutDataModule(**SMALL)
    buffer = data.rollouts.buffer
    buffer.produced, buffer.trained = 10, 6
    buffer.dropped["stale"] = 4  # 10 = 6 + 4 + 0 pending
    return data


def test_the_checkpoint_holds_the_services_accounting():
    saved = datamodule_after_a_run().state_dict()
    assert saved == {
        "rollout_service": {
            "accounting": {
                "produced": 10,
                "trained": 6,
                "dropped": {"stale": 4},
                "pending": 0,
                "by_task": {},
                "pending_groups": [],
            },
            "in_flight": [],  # nothing generating: the service is not started
            "training_draws": {},  # the guessing game draws its instances: no epochs
        }
    }
    resumed = RolloutDataModule(**SMALL)
    resumed.load_state_dict(saved)
    accounting = resumed.state_dict()["rollout_service"]["accounting"]
    assert accounting == {
        **saved["rollout_service"]["accounting"],
        "dropped": {"stale": 4, "restart": 0},
    }  # none was pending


def test_a_checkpoint_from_before_the_services_state_still_resumes():
    old = {"rollout_accounting": {"produced": 10, "trained": 6, "dropped": {"stale": 3}, "pending": 1}}
    resumed = RolloutDataModule(**SMALL)
    resumed.load_state_dict(old)
    # Its pending episode was not kept: dropped as "restart", so produced = trained + dropped still holds.
    assert resumed.state_dict()["rollout_service"]["accounting"] == {
        "produced": 10,
        "trained": 6,
        "dropped": {"stale": 3, "restart": 1},
        "pending": 0,
        "by_task": {},
        "pending_groups": [],
    }
