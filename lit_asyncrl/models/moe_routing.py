"""Which experts a mixture-of-experts policy routes each token to: read from a forward, replayed in another.

A router's top-k choice can flip under a small numeric difference (a bf16 engine against an fp32
trainer, or the trainer's weights one version apart), and the token is then computed by other experts:
a discrepancy no importance ratio of the same token can undo. Routing replay (R3) scores a token under
the routing the engine sampled it with: the trainer's forward takes the given expert ids instead of its
router's top-k, and weights them by its router's own probabilities of those experts, so the router is
still trained through them.

The routers are transformers' top-k router modules (`Qwen3MoeTopKRouter`, `MixtralTopKRouter`, ...: one
per routed layer, returning the router logits, the chosen experts' weights and their ids); reading and
replaying are forward hooks on them, so the model's own forward runs unchanged. A routing is one tensor
per router, in layer order, of shape (tokens, top_k): the tokens of the forward's batch flattened.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch


def has_routed_experts(model_path: str | Path) -> bool:
    """Whether the model folder at `model_path` is a mixture of experts (its config names experts); False
    for a hub id or anything else that is not a local folder."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return False
    settings = json.loads(config.read_text())
    settings = settings.get("text_config", settings)  # a multimodal model's language model
    return any(settings.get(key) for key in ("num_experts", "num_local_experts", "n_routed_experts"))


def topk_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k routers in layer order (empty for a dense model)."""
    return [module for module in model.modules() if type(module).__name__.endswith("TopKRouter")]


@contextlib.contextmanager
def recorded_routing(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, the yielded list holds, after a forward, each router's chosen expert ids
    (tokens, top_k), in layer order (the last forward's, when there are several)."""
    routers = topk_routers(model)
    routing: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * len(routers)

    def record(index: int):
        def hook(module, inputs, output):
            routing[index] = output[2].detach()

        return hook

    handles = [router.register_forward_hook(record(index)) for index, router in enumerate(routers)]
    try:
        yield routing
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def replayed_routing(model: torch.nn.Module, routing: Sequence[torch.Tensor]) -> Iterator[None]:
    """Within the block, each router's forward chooses the experts `routing` gives (one (tokens, top_k)
    tensor of expert ids per router, in layer order; a token given -1 keeps the router's own choice)
    instead of its own top-k; their weights are the router's softmax probabilities of those experts,
    renormalised to sum to 1 where the router does so.

    Raises:
        ValueError: when `routing` does not give one tensor per router, or a forward's token count differs.
    """
    routers = topk_routers(model)
    if len(routing) != len(routers):
        raise ValueError(f"routing replay: {len(routing)} routings given for a model with {len(routers)} routers")

    def replay(given: torch.Tensor):
        def hook(module, inputs, output):
            logits = output[0]
            if given.shape != (logits.shape[0], module.top_k):
                raise ValueError(
                    f"routing replay: a routing of shape {tuple(given.shape)} for a forward of {logits.shape[0]} "
                    f"tokens routed to {module.top_k} experts each"
                )
            # -1: no recorded choice for the token (a position the engine took from its prefix cache,
            # or never computed): the router's own stands.
            chosen = torch.where(given >= 0, given, output[2])
            probabilities = torch.softmax(logits, dim=-1, dtype=torch.float)
            weights = probabilities.gather(-1, chosen)
            if getattr(module, "norm_topk_prob", True):
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), chosen

        return hook

    handles = [router.register_forward_hook(replay(given.long())) for router, given in zip(routers, routing)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def routing_disagreement(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> float:
    """The share of (token, router) pairs whose set of chosen experts differs between two routings of
    the same tokens (the order of a token's experts does not count)."""
    differ = total = 0
    for one, other in zip(first, second, strict=True):
        same = (one.sort(dim=-1).values == other.sort(dim=-1).values).all(dim=-1)
        differ += int((~same).sum())
        total += same.numel()
    return differ / total if total else 0.0
