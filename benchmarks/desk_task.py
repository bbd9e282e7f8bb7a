"""The service desk as the task of `bench_vs_trl.py --task desk` (this library only, sync against async at
tool latency): its shared start model, the overrides of a run, and the environment its evaluation plays.

The start model is the tiny policy after the desk's supervised warm start on scripted demonstrations
(this library's `WarmStart`, as every desk run does before RL), saved once as a model folder, so that
sync and async runs of every seed start from the same weights and their clocks start at the first RL step.
The desk is multi-turn: each tool answer (`env.latency_s`) waits, 2 or 3 of them per episode.
"""

from __future__ import annotations

from pathlib import Path

#: This library's Hydra overrides of a desk run (beside `vs_trl_setup.shared_overrides`).
DESK_OVERRIDES = ("env=service_desk",)
#: Held-out instances the evaluator plays at each mark (each `EVAL_SAMPLES` times).
EVAL_INSTANCES = 200


def write_desk_start_model(out: Path, steps: int, seed: int = 0) -> None:
    """The tiny policy after `steps` warm-start steps on the desk's demonstrations, saved with its tokenizer."""
    import lightning as L
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_asyncrl.envs import ServiceDeskEnv
    from lit_asyncrl.models import resolve_model_path
    from lit_asyncrl.warm_start import WarmStart

    tiny = resolve_model_path(None)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    L.seed_everything(seed, verbose=False)
    model = AutoModelForCausalLM.from_pretrained(tiny).train()  # as the module's policy is when it warm-starts
    WarmStart(steps=steps, seed=seed).run(model, ServiceDeskEnv(), tokenizer, enable_progress_bar=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def desk_evaluation_env():
    """The desk as the evaluator plays it: no latency (evaluation time is not counted anyway)."""
    from lit_asyncrl.envs import ServiceDeskEnv

    return ServiceDeskEnv()
