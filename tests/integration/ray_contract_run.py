"""Run by `test_scale_out.py` in a process of its own: an engine in a Ray actor (on a Ray instance
this process starts) keeps the engine protocol; then the process waits to be killed outright.

    python -m tests.integration.ray_contract_run
"""

import sys
import time

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine_config import EngineConfig
from lit_asyncrl.rollout.ray_engine import RayEngine
from lit_asyncrl.rollout.ray_placement import RayPlacement
from tests.integration.conftest import SMALL_KV_CACHE_BYTES
from tests.integration.engine_contract import check_engine_contract

#: Printed once the contract holds; the test kills this process when it reads it.
KEPT = "the Ray engine kept the engine protocol"

if __name__ == "__main__":
    model_path = resolve_model_path(None)
    engine = RayEngine(model_path, EngineConfig(max_model_len=256, kv_cache_bytes=SMALL_KV_CACHE_BYTES), RayPlacement(num_cpus=0.5))
    engine.start()
    check_engine_contract(engine, AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict())
    print(KEPT, flush=True)
    time.sleep(600)  # killed here, the engine and the Ray instance still up
    sys.exit(1)
