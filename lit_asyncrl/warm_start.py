"""A short supervised warm start on scripted demonstrations, before RL begins.

Tiny random policies first have to discover the answer format; a few supervised steps on scripted
plays (the environment's `demonstration`) skip that phase (shared/notes/task-learnability.md).
"""

from __future__ import annotations

import random

import torch

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.records import Trajectory, collate
from lit_asyncrl.scoring import token_logprobs


def demonstration_trajectories(env: Environment, tokenizer, num_episodes: int, rng: random.Random) -> list[Trajectory]:
    """Scripted plays as trajectories: demonstrated agent turns are the policy tokens."""
    trajectories = []
    for _ in range(num_episodes):
        instance = env.sample_instance(rng)
        trajectory = Trajectory(group_id=-1)
        trajectory.extend_context([tokenizer.bos_token_id, *tokenizer.encode(env.new_episode(instance).reset(), add_special_tokens=False)])
        for action, observation in env.demonstration(instance):
            action_ids = tokenizer.encode(action, add_special_tokens=False)
            trajectory.extend_policy(action_ids, [0.0] * len(action_ids), [0] * len(action_ids))
            trajectory.extend_context(tokenizer.encode(observation, add_special_tokens=False))
        trajectories.append(trajectory)
    return trajectories


def supervised_warm_start(
    policy: torch.nn.Module,
    env: Environment,
    tokenizer,
    *,
    steps: int,
    lr: float,
    batch_size: int = 64,
    seed: int = 0,
) -> list[float]:
    """Minimise the NLL of demonstrated agent tokens for `steps` Adam steps; returns the losses."""
    rng = random.Random(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    device = next(policy.parameters()).device
    losses = []
    for _ in range(steps):
        batch = collate(demonstration_trajectories(env, tokenizer, batch_size, rng), pad_id=tokenizer.pad_token_id)
        mask = batch["loss_mask"].to(device)
        logprobs = token_logprobs(policy, batch["input_ids"].to(device), batch["attention_mask"].to(device), temperature=1.0)
        loss = -(logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
