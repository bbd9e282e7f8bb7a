"""The built-in tiny mixture-of-experts policy (`model=tiny_moe`): the tiny policy's attention and
character tokenizer with a Qwen3-MoE feed-forward (8 experts, each token routed to 2), random init, seeded.

The paper's second backbone is an MoE model, and MoE is where the train-inference discrepancy is
largest: a router's top-k choice can flip under a small numeric difference, and the token is then
computed by other experts. This policy lets that be measured and trained on 2 CPU cores. Like the
tiny policy it is written once as a real Hugging Face folder under the cache, keyed by its config.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from lit_asyncrl.cache_dir import default_cache_dir
from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from lit_asyncrl.models.folder import cached_model_folder
from lit_asyncrl.models.tiny import TinyPolicyConfig, shared_architecture


@dataclasses.dataclass(frozen=True)
class TinyMoEConfig(TinyPolicyConfig):
    """The tiny policy's shapes with a routed feed-forward (about 0.5M parameters by default)."""

    num_experts: int = 8
    #: Experts each token is routed to (the router's top-k).
    num_experts_per_tok: int = 2
    #: Each expert's feed-forward width: 2 of 8 experts at 64 is the dense policy's 256 halved.
    moe_intermediate_size: int = 64


def build_tiny_moe(config: TinyMoEConfig = TinyMoEConfig(), cache_dir: Path | None = None) -> Path:
    """Write the tiny MoE policy folder if it is not there yet and return its path (idempotent)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    target = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3moe-{config.fingerprint()}"

    def build():
        tokenizer = build_char_tokenizer()
        hf_config = Qwen3MoeConfig(
            num_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            moe_intermediate_size=config.moe_intermediate_size,
            # (the width of dense layers between routed ones; there are none)
            intermediate_size=config.intermediate_size,
            # Every layer routed (no dense layers in between), top-k weights renormalised to sum to 1.
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            # The auxiliary load-balancing loss stays off: the RL loss is the paper's, nothing added.
            output_router_logits=False,
            **shared_architecture(config, tokenizer),
        )
        torch.manual_seed(config.seed)
        return Qwen3MoeForCausalLM(hf_config), tokenizer

    return cached_model_folder(target, build)
