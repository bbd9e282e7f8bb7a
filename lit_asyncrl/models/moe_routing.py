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

In training, a batch carries the engine's routing of its positions under each weight version that computed
them (`BatchRouting`); the policy's routers follow it (`follow_batch_routing`) in every forward run under
`applied`, which the training step and the references that score a batch in it enter around their forwards:
each snapshot follows its own version's routing, the live weights and the EWMA each position's newest.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from lit_asyncrl.rollout.records import NO_VERSION


def has_routed_experts(model_path: str | Path) -> bool:
    """Whether the model folder at `model_path` is a mixture of experts (its config names experts); False
    for a hub id or anything else that is not a local folder."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return False
    settings = json.loads(config.read_text())
    settings = settings.get("text_config", settings)  # a multimodal model's language model
    return any(settings.get(key) for key in ("num_experts", "num_local_experts", "n_routed_experts"))


def is_topk_router(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("TopKRouter")


def topk_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k routers in layer order (empty for a dense model)."""
    return [module for module in model.modules() if is_topk_router(module)]


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
            _check_routing_shape(module, output, given)
            return _replayed(module, output, given)

        return hook

    handles = [router.register_forward_hook(replay(given.long())) for router, given in zip(routers, routing)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _check_routing_shape(router: torch.nn.Module, output: tuple, given: torch.Tensor) -> None:
    tokens = output[0].shape[0]
    if given.shape != (tokens, router.top_k):
        raise ValueError(
            f"routing replay: a routing of shape {tuple(given.shape)} for a forward of {tokens} "
            f"tokens routed to {router.top_k} experts each"
        )


def _replayed(router: torch.nn.Module, output: tuple, given: torch.Tensor) -> tuple:
    """A router's output (logits, weights, expert ids) with the experts `given` [tokens, top_k] chose."""
    logits = output[0]
    # -1: no recorded choice for the token (a position the engine took from its prefix cache,
    # or never computed): the router's own stands.
    chosen = torch.where(given >= 0, given, output[2])
    probabilities = torch.softmax(logits, dim=-1, dtype=torch.float)
    weights = probabilities.gather(-1, chosen)
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights.to(logits.dtype), chosen


def routing_disagreement(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> float:
    """The share of (token, router) pairs whose set of chosen experts differs between two routings of
    the same tokens (the order of a token's experts does not count)."""
    differ = total = 0
    for one, other in zip(first, second, strict=True):
        same = (one.sort(dim=-1).values == other.sort(dim=-1).values).all(dim=-1)
        differ += int((~same).sum())
        total += same.numel()
    return differ / total if total else 0.0


@dataclasses.dataclass
class BatchRouting:
    """The experts the engine chose for a batch's positions, for the forwards that score the batch.

    The engine may have computed a position under several weight versions (a push computes the positions of
    the requests in flight again), each with its own routing: a forward follows one version's (`version`,
    the snapshot of the version that sampled the tokens it scores) or each position's newest (None: the live
    weights, the EWMA).

    Attributes:
        recorded: [B, T, S, layers, top_k] a position's routing under each version that computed it, -1 where
            a slot holds none (`collate`'s `routed_experts`).
        recorded_versions: [B, T, S] the version of each slot's routing, NO_VERSION where it holds none.
        replay: the routers take the followed experts (routing replay); False: they keep their own choice and
            the forwards only count where it differs.
        version: the version whose routing the forwards follow (where it computed a position not, the newest
            earlier one's: `_routing_up_to`); None: each position's newest.
        experts: [B, T, layers, top_k] what the forwards follow: -1 where the engine recorded none (a
            position it took from its prefix cache, the last token of a turn, padding, an episode restored
            from a checkpoint, a position no version up to `version` computed).
        flipped: (position, layer) pairs, over the forwards run under this routing, whose router's own
            top-k set differs from the followed one; `compared`: the pairs with a recorded choice.
    """

    recorded: torch.Tensor
    recorded_versions: torch.Tensor
    replay: bool
    version: int | None = None
    flipped: int = 0
    compared: int = 0
    experts: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.experts = _routing_up_to(self.recorded, self.recorded_versions, self.version)

    def rows(self, rows: torch.Tensor | slice, version: int | None = None) -> BatchRouting:
        """The routing of the batch's sequences `rows` under `version` (None: each position's newest), for a
        forward over only those, counted apart."""
        return BatchRouting(self.recorded[rows], self.recorded_versions[rows], self.replay, version)

    @property
    def flipped_share(self) -> float:
        return self.flipped / self.compared if self.compared else 0.0


def _routing_up_to(recorded: torch.Tensor, recorded_versions: torch.Tensor, version: int | None) -> torch.Tensor:
    """[B, T, layers, top_k]: each position's routing from the newest version up to `version` (None: any) that
    computed it; -1 where none did (a position after that version's tokens).

    Not only `version`'s own: a push that changed no tensor relabels the engine's weights without computing
    anything again, so that version's tokens attend to positions an earlier version computed with the same
    weights. Every other push computes the requests in flight again (and empties the prefix cache)."""
    eligible = recorded_versions
    if version is not None:
        eligible = torch.where(recorded_versions <= version, recorded_versions, NO_VERSION)
    newest = eligible.max(dim=-1)
    index = newest.indices[:, :, None, None, None].expand(-1, -1, 1, *recorded.shape[3:])
    chosen = recorded.gather(2, index).squeeze(2)
    return torch.where(newest.values[..., None, None] == NO_VERSION, -1, chosen).to(recorded.dtype)


#: The batch key of a training batch's `BatchRouting` (set by the module from its `routed_experts`).
BATCH_ROUTING = "routing"


def batch_routing_of(batch: dict, rows: torch.Tensor | None = None, version: int | None = None) -> BatchRouting | None:
    """The routing a forward over `batch`'s sequences `rows` (None: all) follows: `version`'s (None: each
    position's newest), counted apart from the training forward's; None when the batch carries none."""
    routing = batch.get(BATCH_ROUTING)
    if routing is None:
        return None
    return routing.rows(slice(None) if rows is None else rows, version)


#: The batch routing the forwards in progress follow (`applied`); None outside.
_APPLIED: contextvars.ContextVar[BatchRouting | None] = contextvars.ContextVar("batch_routing", default=None)


@contextlib.contextmanager
def applied(routing: BatchRouting | None) -> Iterator[None]:
    """Within the block, the forwards of a model that `follow_batch_routing` follow `routing` (nothing
    changes for None: a dense policy, a batch without a recorded routing)."""
    token = _APPLIED.set(routing)
    try:
        yield
    finally:
        _APPLIED.reset(token)


def follow_batch_routing(model: torch.nn.Module) -> None:
    """Make each of `model`'s routers follow the batch routing `applied` sets: count where its own
    choice differs from the recorded one and, with `BatchRouting.replay`, take the recorded experts.
    The hooks stay for the model's life (a forward outside `applied` is not touched); a dense model
    gets none."""
    for name, module in model.named_modules():
        if is_topk_router(module):
            module.register_forward_hook(_FollowBatchRouting(decoder_layer_index(name)))


class _FollowBatchRouting:
    """One router's hook for `follow_batch_routing` (a class, not a closure, so that a model holding it
    can still be pickled: a Ray actor's or a spawned process's copy)."""

    def __init__(self, layer: int) -> None:
        self.layer = layer

    def __call__(self, router: torch.nn.Module, inputs: tuple, output: tuple) -> tuple | None:
        routing = _APPLIED.get()
        if routing is None:
            return None
        top_k = routing.experts.shape[-1]
        given = routing.experts[:, :, self.layer].reshape(-1, top_k).to(output[2].device, torch.long)
        _check_routing_shape(router, output, given)
        recorded = (given >= 0).all(dim=-1)
        same = (output[2].sort(dim=-1).values == given.sort(dim=-1).values).all(dim=-1)
        routing.flipped += int((recorded & ~same).sum())
        routing.compared += int(recorded.sum())
        return _replayed(router, output, given) if routing.replay else None


def decoder_layer_index(module_name: str) -> int:
    """The decoder layer a module belongs to, read from its name (`model.layers.3.mlp.gate` -> 3): the
    index the engine records a layer's routing under (vLLM's layer ids), also where dense layers sit
    between routed ones."""
    parts = module_name.split(".")
    for part, following in zip(parts, parts[1:]):
        if part == "layers" and following.isdigit():
            return int(following)
    raise ValueError(f"routing replay: cannot tell which decoder layer {module_name!r} belongs to")
