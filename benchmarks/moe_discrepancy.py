"""The training-inference discrepancy of a mixture of experts against a dense policy of equal active
size, and where it comes from: |log pi - log mu| per token with an fp32 and a bf16 engine, and the share of
tokens a router sends to other experts when the forward runs in bf16.

The policies: the tiny MoE policy (`model=tiny_moe`: 8 experts of width 64, each token to 2, so 128 of
feed-forward width active) and the tiny dense policy with a feed-forward of width 128 (its default is 256),
both as built (random weights, seeded). For each policy and engine dtype one engine samples `--turns`
turns of `--tokens` tokens at temperature 1 from one-token prompts, and the fp32 trainer scores the same
tokens at the same weights: with nothing stale, pi / mu is the discrepancy alone. For the MoE the trainer
also runs the same tokens in bf16 and counts the (token, layer) pairs whose top-2 set differs from the
fp32 forward's: the routing flips a bf16 engine would make where its own choices cannot be read.

    .venv/bin/python benchmarks/moe_discrepancy.py            # 4 engines, 64 turns of 64 tokens each (~2 min)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

import torch

TEMPERATURE = 1.0


def sampled_turns(model_path, dtype: str, turns: int, tokens: int) -> list:
    from lit_asyncrl.rollout.engine.settings import EngineSettings
    from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine

    engine = VLLMEngine(model_path, EngineSettings(dtype=dtype, max_model_len=tokens + 8, kv_cache_gib=0.25))
    engine.start()
    try:

        async def sample_all():
            prompts = [[1 + index % 90] for index in range(turns)]
            return await asyncio.gather(
                *(
                    engine.generate(prompt, max_tokens=tokens, temperature=TEMPERATURE, ignore_eos=True)
                    for prompt in prompts
                )
            ), prompts

        finished, prompts = engine.run(sample_all(), timeout_s=600)
    finally:
        engine.shutdown()
    return list(zip(prompts, finished))


def discrepancy(model, turns: list) -> list[float]:
    """|log pi - log mu| of every sampled token, pi the fp32 trainer's."""
    from lit_asyncrl.scoring import token_logprobs

    gaps = []
    for prompt, turn in turns:
        ids = torch.tensor([prompt + turn.token_ids])
        with torch.no_grad():
            pi = token_logprobs(model, ids, torch.ones_like(ids), TEMPERATURE)[0, len(prompt) :]
        gaps += (pi - torch.tensor(turn.logprobs)).abs().tolist()
    return gaps


def bf16_routing_flips(model, turns: list) -> tuple[float, list[bool]]:
    """The share of (token, layer) pairs whose experts differ between the fp32 and a bf16 forward, and
    for each sampled token whether the position that predicted it flipped in any layer."""
    import copy

    from lit_asyncrl.models.moe_routing import recorded_routing, routing_disagreement

    low = copy.deepcopy(model).to(torch.bfloat16)
    shares, flipped = [], []
    for prompt, turn in turns:
        ids = torch.tensor([prompt + turn.token_ids])
        with torch.no_grad(), recorded_routing(model) as full, recorded_routing(low) as half:
            model(ids)
            low(ids)
            shares.append(routing_disagreement(full, half))
            differs = torch.stack(
                [(one.sort(-1).values != other.sort(-1).values).any(-1) for one, other in zip(full, half)]
            ).any(0)
        # The logits at position j give token j + 1: a sampled token's predicting position is one before it.
        flipped += differs[len(prompt) - 1 : len(prompt) - 1 + len(turn.token_ids)].tolist()
    return statistics.fmean(shares), flipped


def main() -> None:
    from transformers import AutoModelForCausalLM

    from lit_asyncrl.models import TinyPolicyConfig, build_tiny_moe, build_tiny_policy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    policies = {
        "dense (ffn 128)": build_tiny_policy(TinyPolicyConfig(intermediate_size=128)),
        "MoE (2 of 8 x 64)": build_tiny_moe(),
    }
    print(f"{args.turns} turns of {args.tokens} tokens per policy and engine dtype, temperature {TEMPERATURE}")
    print(
        "| policy | parameters | engine | mean abs log(pi/mu) | max | tokens above 0.01 | bf16 routing flips "
        "| mean abs log(pi/mu), flipped / other tokens |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for label, path in policies.items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        size = sum(parameter.numel() for parameter in model.parameters())
        for dtype in ("float32", "bfloat16"):
            turns = sampled_turns(path, dtype, args.turns, args.tokens)
            gaps = discrepancy(model, turns)
            flips, split = "–", "–"
            if "MoE" in label and dtype == "bfloat16":
                share, flipped = bf16_routing_flips(model, turns)
                on, off = [gap for gap, f in zip(gaps, flipped) if f], [gap for gap, f in zip(gaps, flipped) if not f]
                flips = f"{share:.3f}"
                split = f"{statistics.fmean(on) if on else float('nan'):.2e} ({len(on)}) / {statistics.fmean(off):.2e}"
            above = sum(gap > 0.01 for gap in gaps) / len(gaps)
            print(
                f"| {label} | {size:,} | {dtype} | {statistics.fmean(gaps):.2e} | {max(gaps):.2e} | {above:.3f} "
                f"| {flips} | {split} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
