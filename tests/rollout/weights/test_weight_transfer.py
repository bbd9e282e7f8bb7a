"""Which weight-transfer route a configuration selects, what vLLM is told, and what is sent (no engine starts)."""

import pytest
import torch

from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.rollout.engine.settings import EngineSettings, engine_args
from lit_asyncrl.rollout.weights.actor_route import ActorRoute
from lit_asyncrl.rollout.weights.adapters import AdapterRoute, EngineAdapters
from lit_asyncrl.rollout.weights.changed_tensors import ChangedTensors, WholeTensors
from lit_asyncrl.rollout.weights.choice import actor_route, local_route, select_weight_transfer
from lit_asyncrl.rollout.weights.file_routes import FileRoute, StagedRoute
from lit_asyncrl.rollout.weights.transfer import (
    EngineWeightSyncClient,
    GlooRoute,
    IPCRoute,
    NCCLRoute,
    weights_for_engine,
)
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm


@pytest.mark.parametrize(
    ("requested", "device", "placement", "processes", "route"),
    [
        ("auto", "cpu", "local", 1, "file"),  # the engine stands still for less of the push
        ("auto", "cpu", "ray", 2, "file"),
        ("auto", "cuda", "local", 1, "ipc"),  # one trainer beside its engine on one GPU
        ("auto", "cuda", "local", 2, "nccl"),  # DDP: only rank 0 pushes, IPC would wait for the others
        ("auto", "cuda", "ray", 1, "nccl"),  # an actor may sit on another GPU or node
        ("file", "cpu", "local", 1, "file"),
        ("file", "cuda", "ray", 4, "file"),
        ("staged", "cpu", "local", 1, "staged"),
        ("staged", "cpu", "local", 2, "staged"),  # DDP: rank 0 stages for its engines
        ("gloo", "cuda", "local", 1, "gloo"),
        ("nccl", "cuda", "local", 2, "nccl"),
        ("ipc", "cuda", "local", 1, "ipc"),
    ],
)
def test_the_route_each_configuration_selects(requested, device, placement, processes, route):
    assert select_weight_transfer(requested, device, placement, processes) == route


@pytest.mark.parametrize(
    ("requested", "device", "placement", "processes", "message"),
    [
        (
            "nccl",
            "cpu",
            "local",
            1,
            r"rollout.weight_transfer=nccl needs CUDA GPUs \(this machine's vLLM platform is 'cpu'\); use gloo or file",
        ),
        ("ipc", "cpu", "local", 1, r"rollout.weight_transfer=ipc needs CUDA GPUs"),
        ("ipc", "cuda", "ray", 1, r"with rollout.placement=ray use nccl"),
        (
            "ipc",
            "cuda",
            "local",
            2,
            r"rollout.weight_transfer=ipc with 2 trainer processes: only rank 0 pushes weights here; use nccl",
        ),
        ("shm", "cpu", "local", 1, r"rollout.weight_transfer='shm': choose one of auto, file, staged, gloo, nccl, ipc"),
        (
            "staged",
            "cuda",
            "local",
            1,
            r"rollout.weight_transfer=staged packs weights for vLLM's CPU kernels in a local engine .*'cuda'.*; use file",
        ),
        ("staged", "cpu", "ray", 1, r"rollout.weight_transfer=staged .* rollout.placement=ray\); use file"),
    ],
)
def test_impossible_routes_are_refused_naming_the_key(requested, device, placement, processes, message):
    with pytest.raises(ValueError, match=message):
        select_weight_transfer(requested, device, placement, processes)


@pytest.mark.parametrize(
    ("name", "local", "to_an_actor"),
    [
        ("file", FileRoute, ActorRoute),
        ("staged", StagedRoute, ActorRoute),
        ("gloo", GlooRoute, GlooRoute),
        ("nccl", NCCLRoute, NCCLRoute),
        ("ipc", IPCRoute, IPCRoute),
    ],
)
def test_each_chosen_route_is_a_class_of_its_own_for_both_engines(name, local, to_an_actor):
    settings = EngineSettings(weight_transfer=name)
    assert type(local_route(settings, adapters=None, max_loras=4)) is local
    assert type(actor_route(settings)) is to_an_actor
    assert isinstance(
        local_route(settings, adapters=None, max_loras=4).selection, ChangedTensors
    )  # then only what was written


def test_adapters_take_the_adapter_route_whatever_the_transfer_and_travel_whole(tmp_path):
    lora = LoRASettings(rank=8, push="adapter")
    for name in ("file", "gloo"):
        settings = EngineSettings(weight_transfer=name, lora=lora)
        route = local_route(settings, EngineAdapters(lora, tmp_path), max_loras=5)
        assert type(route) is AdapterRoute and isinstance(route.selection, WholeTensors)
        assert route.engine_arguments() == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 5, "max_cpu_loras": 5}
        assert type(actor_route(settings)) is ActorRoute and isinstance(actor_route(settings).selection, WholeTensors)


def test_vllm_is_told_the_backend_of_its_weight_transfer_api_and_nothing_for_files():
    for name, route_class in (("gloo", GlooRoute), ("nccl", NCCLRoute), ("ipc", IPCRoute)):
        route = route_class(ChangedTensors(), torch.float32, engine_workers=2)
        args = engine_args(
            "model", EngineSettings(weight_transfer=name, tensor_parallel_size=2), "cuda", 0, route.engine_arguments()
        )
        assert args.weight_transfer_config.backend == name
        assert args.tensor_parallel_size == 2
    file_route = local_route(EngineSettings(), adapters=None, max_loras=4)
    assert file_route.engine_arguments() == {}
    assert (
        engine_args("model", EngineSettings(), "cpu", 0, file_route.engine_arguments()).weight_transfer_config is None
    )
    staged = local_route(EngineSettings(weight_transfer="staged"), adapters=None, max_loras=4).engine_arguments()
    assert staged == {"worker_extension_cls": "lit_asyncrl.rollout.engine.worker_extension.EngineWorkerExtension"}
    # An MoE that records its routing and takes staged weights: one extension does both.
    both = engine_args("model", EngineSettings(capture_routing=True), "cpu", 0, staged)
    assert both.worker_extension_cls == "lit_asyncrl.rollout.engine.worker_extension.EngineWorkerExtension"


def test_the_trainer_opens_a_group_for_itself_and_every_engine_worker():
    from lit_asyncrl.rollout.weights.gloo import GlooTrainerInitInfo  # imports vLLM: not at collection

    workers = EngineSettings(tensor_parallel_size=2, data_parallel_size=3).engine_workers()
    info = GlooRoute(ChangedTensors(), torch.float32, engine_workers=workers).trainer_init_info()
    assert isinstance(info, GlooTrainerInitInfo) and info.backend == "gloo"
    assert (info.rank, info.is_sender, info.world_size, info.master_address) == (0, True, 7, "127.0.0.1")
    assert 0 < info.master_port < 65536


def test_nccl_and_ipc_get_vllms_own_trainer_init_info():
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    route = NCCLRoute(ChangedTensors(), torch.bfloat16, engine_workers=4)
    route.address = "10.0.0.2"  # an actor's engine on another node reaches the trainer there
    nccl = route.trainer_init_info()
    assert isinstance(nccl, NCCLTrainerInitInfo)
    assert (nccl.rank, nccl.world_size, nccl.master_address) == (0, 5, "10.0.0.2")
    ipc = IPCRoute(ChangedTensors(), torch.bfloat16, engine_workers=1).trainer_init_info()
    assert isinstance(ipc, IPCTrainerInitInfo) and ipc.rank == 0


def test_the_engine_gets_its_own_dtype_and_a_tied_embedding_once_as_the_head():
    embedding = torch.randn(5, 3)
    # A tied model's state dict names its one tensor twice; it travels once, under the head's name.
    tied = weights_for_engine(
        {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding, "model.norm.weight": torch.ones(3)},
        torch.bfloat16,
    )
    assert sorted(tied) == ["lm_head.weight", "model.norm.weight"]
    assert all(tensor.dtype == torch.bfloat16 for tensor in tied.values())
    assert torch.equal(tied["lm_head.weight"], embedding.to(torch.bfloat16))
    # A state dict without the head (the embedding stands for it) and a view of the same storage.
    assert list(weights_for_engine({"model.embed_tokens.weight": embedding}, torch.float32)) == ["lm_head.weight"]
    assert list(
        weights_for_engine(
            {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding.view(5, 3)}, torch.float32
        )
    ) == ["lm_head.weight"]
    head = torch.randn(5, 3)
    untied = weights_for_engine({"model.embed_tokens.weight": embedding, "lm_head.weight": head}, torch.float32)
    assert sorted(untied) == ["lm_head.weight", "model.embed_tokens.weight"]  # an untied head: both travel
    assert untied["lm_head.weight"].data_ptr() == head.data_ptr()  # same dtype: no copy, and its own head kept
    assert untied["model.embed_tokens.weight"].data_ptr() == embedding.data_ptr()
    # Equal values in two storages are two parameters, not a tie.
    assert (
        len(
            weights_for_engine(
                {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding.clone()}, torch.float32
            )
        )
        == 2
    )


def test_the_weight_source_declares_what_it_yields():
    sender = GlooRoute(ChangedTensors(), torch.bfloat16, engine_workers=1)
    sender.source.set({"a.weight": torch.ones(2, 3), "b.bias": torch.zeros(4)})
    meta = sender.source.metadata()
    assert [(m.name, m.dtype, m.shape) for m in meta] == [
        ("a.weight", torch.bfloat16, (2, 3)),
        ("b.bias", torch.bfloat16, (4,)),
    ]
    assert [(name, tuple(t.shape), t.dtype) for name, t in sender.source] == [
        ("a.weight", (2, 3), torch.bfloat16),
        ("b.bias", (4,), torch.bfloat16),
    ]


def test_pack_plan_cuts_at_dtype_changes_and_the_size_limit():
    from lit_asyncrl.rollout.weights.gloo import pack_plan

    f32, bf16 = torch.float32, torch.bfloat16
    dtypes, shapes = [f32, f32, bf16, f32], [[2, 3], [4], [5], [1]]
    # 24 + 16 bytes fit in 40; the bf16 tensor starts a buffer, and so does the f32 one after it.
    assert pack_plan(dtypes, shapes, limit_bytes=40) == [[0, 1], [2], [3]]
    assert pack_plan(dtypes, shapes, limit_bytes=39) == [[0], [1], [2], [3]]
    assert pack_plan([f32], [[100]], limit_bytes=10) == [[0]]  # a larger tensor travels alone
    assert pack_plan([], []) == []


def test_the_engine_client_is_a_vllm_weight_sync_client():
    from vllm.distributed.weight_transfer.base import VLLMWeightSyncClient

    calls = []

    class RecordingLLM:
        async def init_weight_transfer_engine(self, request):
            calls.append(("init", request.init_info))

        async def start_weight_update(self):
            calls.append(("start",))

        async def update_weights(self, request):
            calls.append(("update", request.update_info))

        async def finish_weight_update(self, weight_version=None):
            calls.append(("finish", weight_version))

    import asyncio

    client = EngineWeightSyncClient(asyncio.run, RecordingLLM())
    assert isinstance(client, VLLMWeightSyncClient)
    client.init_weight_transfer_engine({"world_size": 2})
    client.start_weight_update()
    client.update_weights({"names": ["a"]})
    client.finish_weight_update("3")
    assert calls == [("init", {"world_size": 2}), ("start",), ("update", {"names": ["a"]}), ("finish", "3")]


@pytest.mark.parametrize(
    ("requested", "device", "route"),
    [("auto", "cpu", "staged"), ("staged", "cpu", "staged"), ("auto", "cuda", "ipc"), ("gloo", "cuda", "gloo")],
)
def test_a_mixture_of_experts_on_cpu_takes_the_staged_route(requested, device, route):
    assert select_weight_transfer(requested, device, "local", 1, routed_experts=True) == route


@pytest.mark.parametrize("requested", ["file", "gloo"])
def test_a_route_that_leaves_cpu_experts_unpacked_is_refused_for_a_mixture_of_experts(requested):
    with pytest.raises(
        ValueError, match=rf"rollout.weight_transfer={requested} with a mixture-of-experts policy on CPU"
    ):
        select_weight_transfer(requested, "cpu", "local", 1, routed_experts=True)
    assert select_weight_transfer(requested, "cpu", "local", 1, routed_experts=False) == requested


def test_the_policys_folder_decides_the_route_and_adapters_of_an_moe_are_refused_on_cpu():
    from lit_asyncrl.models import resolve_model_path
    from lit_asyncrl.models.lora import LoRASettings
    from lit_asyncrl.rollout.engine.settings import EngineSettings
    from lit_asyncrl.rollout.weights.choice import route_for_policy

    moe, dense = resolve_model_path("tiny_moe"), resolve_model_path(None)
    assert route_for_policy(EngineSettings(), "cpu", "local", 1, str(moe)) == "staged"
    assert route_for_policy(EngineSettings(), "cpu", "local", 1, str(dense)) == "file"
    merged = LoRASettings(rank=8, target_modules=("q_proj", "v_proj"), push="merged")
    assert route_for_policy(EngineSettings(lora=merged), "cpu", "local", 1, str(moe)) == "staged"
    adapters = EngineSettings(lora=LoRASettings(rank=8, target_modules=("q_proj", "v_proj")))
    with pytest.raises(ValueError, match="model.lora.push=adapter with a mixture-of-experts policy on CPU"):
        route_for_policy(adapters, "cpu", "local", 1, str(moe))
    assert route_for_policy(adapters, "cpu", "local", 1, str(dense)) == "file"
