"""Per-token NLL of the warm-started tiny policy on demonstrations of the JSON-tool desk (compact rendering).

Run from the repository root: `.venv/bin/python docs/results/service_desk_tools_tiny/per_token_nll.py`
(400 warm-start steps at lr 1e-3, batch 64, seed 0, as `experiment=service_desk_tools model.warm_start_steps=400`);
prints each demonstration, its summed NLL over the policy tokens and its five worst tokens with the text before them.
"""

import random

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_asyncrl.envs.service_desk.tools_task import ServiceDeskToolsEnv
from lit_asyncrl.models.tiny import build_tiny_policy
from lit_asyncrl.rollout.episodes.for_task import episode_formats_for
from lit_asyncrl.warm_start import WarmStart, demonstration_trajectories

torch.manual_seed(0)
path = build_tiny_policy()
tokenizer = AutoTokenizer.from_pretrained(path)
policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
env = ServiceDeskToolsEnv()
print(
    "warm-start nll",
    WarmStart(steps=400, lr=1e-3, batch_size=64, seed=0).run(policy, env, tokenizer, enable_progress_bar=False),
)
policy.eval()
episode_format = episode_formats_for(tokenizer, env)[None]
for trajectory in demonstration_trajectories(env, {None: episode_format}, 8, random.Random(5)):
    ids, mask = torch.tensor([trajectory.token_ids]), torch.tensor(trajectory.loss_mask)
    with torch.no_grad():
        logits = policy(ids).logits[0, :-1]
    logprobs = F.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
    policy_token = mask[1:]
    worst = sorted((float(logprobs[i]), i + 1) for i in range(len(logprobs)) if policy_token[i])[:5]
    print(repr(tokenizer.decode(trajectory.token_ids)))
    context = [
        (
            round(value, 2),
            repr(tokenizer.decode([trajectory.token_ids[i]])),
            repr(tokenizer.decode(trajectory.token_ids[max(0, i - 12) : i])),
        )
        for value, i in worst
    ]
    print("  sum nll over policy", float(-(logprobs[policy_token]).sum()), "worst", context)
