"""An agent program (an OpenAI-SDK agent, `tests/support/sum_agent.py`) trains through the endpoint on the
real engine and real Lightning training (`env=agent_program`, the tiny policy's compact rendering): every
trained episode is the agent's calls as one trajectory, its sampled tokens with their versions and mu."""

import json

import pytest

from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from tests.support.runs import SMALL_RUN, read_rows, run_hydra

pytestmark = pytest.mark.engine


#: The exact routes that score calls while they run: interruption-sync scores a call still streaming at a
#: version change, the dedicated worker each filed group (and the outgoing version's partial turns).
EXPERIMENTS = ("interrupt_sync", "dedicated")


def test_an_openai_sdk_agent_trains_through_the_endpoint_on_the_exact_routes(tmp_path, subtests):
    # One Hydra multirun (one process, its jobs one after another): every call's tokens are scored
    # under their own versions (`train/nonfinite_tokens` 0).
    run_hydra(
        [
            "-m",
            f"experiment={','.join(EXPERIMENTS)}",
            f"hydra.sweep.dir={tmp_path}",
            *[override for override in SMALL_RUN if not override.startswith("model.warm_start_steps")],
            "model.warm_start_steps=0",
            "env=agent_program",
            "env.agent=tests.support.sum_agent.two_tries",
            "env.instances=tests.support.sum_agent.draw_sum",
            "env.max_turn_tokens=4",
            "trainer.max_steps=3",
            "trainer.num_sanity_val_steps=0",
            "save_trained_episodes=true",
        ]
    )
    for job, experiment in enumerate(EXPERIMENTS):
        with subtests.test(experiment=experiment):
            (run_dir,) = tmp_path.glob(f"{job}_*")
            assert f"experiment={experiment}" in run_dir.name
            check_run(run_dir)


def check_run(run_dir) -> None:
    rows = read_rows(run_dir / "metrics.csv")
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert all(row["rollout/episode_segments"] == 0 for row in rows)  # the agent never rewrites its history
    assert all(row["train/nonfinite_tokens"] == 0 for row in rows)
    tokenizer = build_char_tokenizer()
    for step in range(3):
        episodes = [json.loads(line) for line in (run_dir / "trained_episodes" / f"step={step}.jsonl").open()]
        assert len(episodes) == 16
        for episode in episodes:
            ids, mask, versions = episode["input_ids"], episode["loss_mask"], episode["versions"]
            # The compact rendering: the question on its own line, then the answer; after a wrong one the
            # agent's "no" on a line of its own and a second answer: one or two sampled spans.
            starts = [i for i, sampled in enumerate(mask) if sampled and (i == 0 or not mask[i - 1])]
            ends = [i for i, sampled in enumerate(mask) if sampled and (i + 1 == len(mask) or not mask[i + 1])]
            assert len(starts) in (1, 2)
            assert tokenizer.decode(ids[: starts[0]], skip_special_tokens=True).endswith("=\n")
            if len(starts) == 2:
                assert tokenizer.decode(ids[ends[0] + 1 : starts[1]], skip_special_tokens=True) == "no\n"
            # Sampled tokens carry a version and mu; the agent's own messages carry none.
            assert all((version >= 0) == bool(sampled) for version, sampled in zip(versions, mask))
            assert all(mu <= 0 for mu, sampled in zip(episode["behavior_logprobs"], mask) if sampled)
