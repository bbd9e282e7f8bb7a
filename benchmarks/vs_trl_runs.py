"""One run of `bench_vs_trl.py` in a process of its own, so each has its own peak memory and nothing of
one library is loaded beside the other:

    python benchmarks/vs_trl_runs.py trl|sync|async|evaluate --settings JSON --seed S --data FILE --start DIR --out DIR

`trl`: TRL's GRPOTrainer (transformers' `generate`, KV cache on); `sync` and `async`: this library's
`rollout.mode`; each saves its policy at the wall-clock marks and writes `result.json` (steps, marks,
tokens, start-up time, peak memory). `evaluate`: this library's held-out evaluator on one engine, every
saved mark of the folders given, written to `evaluation.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch
from vs_trl_setup import ANSWER_END, PROMPT_START, BenchSettings, MarkClock, read_rows, shared_overrides

#: GRPOConfig's settings that match this library's (no top-k, constant AdamW learning rate without weight
#: decay, no KL term, token-mean loss, group-normalised advantages, one update per generation) and quiet it.
TRL_AS_OURS = {
    "top_k": 0,
    "lr_scheduler_type": "constant",
    "weight_decay": 0.0,
    "beta": 0.0,
    "loss_type": "dapo",
    "scale_rewards": "group",
    "num_iterations": 1,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": [],
    "use_cpu": True,
    "disable_tqdm": True,
}
#: Held-out answers sampled per prompt at each mark (the evaluation's `samples`).
EVAL_SAMPLES = 4


def peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_trl(settings: BenchSettings, seed: int, data: Path, start: Path, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    process_started = time.perf_counter()
    clock = MarkClock(settings, out)
    tokens = {"generated": 0.0}

    def exact_match(completions, answer, **_):
        return [float(completion.strip() == expected) for completion, expected in zip(completions, answer)]

    class Marks(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:  # the clock starts with the first step, as this library's
                self.setup_s = time.perf_counter() - process_started
                clock.start()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                tokens["generated"] += float(logs["completions/mean_length"]) * completions_per_step

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if clock.after_step(state.global_step, model.state_dict):
                control.should_training_stop = True

    completions_per_step = settings.prompts_per_step * settings.samples_per_prompt
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=completions_per_step,
        num_generations=settings.samples_per_prompt,
        max_completion_length=settings.max_completion_tokens,
        temperature=settings.temperature,
        learning_rate=settings.learning_rate,
        max_steps=1_000_000,
        seed=seed,
        **TRL_AS_OURS,
    )
    rows = read_rows(data, "train")
    train = Dataset.from_list([{"prompt": PROMPT_START + row["prompt"], "answer": row["answer"]} for row in rows])
    marks = Marks()
    trainer = GRPOTrainer(
        model=str(start),
        reward_funcs=[exact_match],
        args=config,
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(start),
        callbacks=[marks],
    )
    trainer.train()
    elapsed = clock.elapsed()
    return {
        "steps": trainer.state.global_step,
        "train_s": elapsed,
        "setup_s": marks.setup_s,
        "generated_tokens": tokens["generated"],
        "trained_tokens": tokens["generated"],  # on-policy: every generated token trains once
        "marks": clock.marks,
        "peak_memory_mb": peak_memory_mb(),
    }


def trl_generation_speed(settings: BenchSettings, data: Path, start: Path, rounds: int = 10) -> dict:
    """transformers' `generate` alone, as TRL calls it (KV cache on, sampling at the run's temperature):
    one step's completions (prompts x samples), after 3 rounds of warm-up; completion tokens per second."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(start)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(start).eval()
    rows = read_rows(data, "train")[: settings.prompts_per_step]
    prompts = [PROMPT_START + row["prompt"] for row in rows for _ in range(settings.samples_per_prompt)]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    generated, seconds = 0, 0.0
    for round_ in range(3 + rounds):
        started = time.perf_counter()
        with torch.no_grad():
            output = model.generate(
                **inputs,
                do_sample=True,
                temperature=settings.temperature,
                top_k=0,
                max_new_tokens=settings.max_completion_tokens,
                use_cache=True,
                pad_token_id=tokenizer.pad_token_id,
            )
        if round_ >= 3:
            seconds += time.perf_counter() - started
            completions = output[:, inputs["input_ids"].shape[1] :]
            generated += int((completions != tokenizer.pad_token_id).sum())
    return {"generated_tokens": generated, "seconds": seconds, "tokens_per_s": generated / seconds}


#: A benchmark's trainer: no held-out evaluation (the benchmark evaluates its saved policies itself), no
#: logger, checkpoint, progress bar or summary: nothing but training is timed.
QUIET_TRAINER = (
    "trainer.num_sanity_val_steps=0",
    "trainer.val_check_interval=1000000",
    "+trainer.limit_val_batches=0",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
    "trainer.logger=false",
    "trainer.enable_checkpointing=false",
    "trainer.callbacks=[]",
)


def lit_overrides(settings: BenchSettings, data: Path) -> list[str]:
    """This library's Hydra overrides of the sums task (the run's own: `shared_overrides`)."""
    return [
        "env=dataset",
        f"env.path={data}",
        "env.split_key=split",
        f"env.max_turn_tokens={settings.max_completion_tokens}",
        f"env.turn_stop='{ANSWER_END}'",
    ]


def run_lit(settings: BenchSettings, mode: str, seed: int, start: Path, overrides: list[str], out: Path) -> dict:
    """A run of this library in `mode` from `start` with the task's `overrides`, trained for the budget
    and saved at the marks."""
    import lightning as L

    process_started = time.perf_counter()
    clock = MarkClock(settings, out)
    overrides = [
        *shared_overrides(settings, mode, seed, start),
        *overrides,
        *QUIET_TRAINER,
        f"trainer.default_root_dir={out / 'lit'}",
    ]

    class Marks(L.Callback):
        trained_tokens = 0.0
        generated_at_start = generated_at_end = train_s = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            # The clock starts with the first step (the engine started, its first batch in hand).
            if trainer.global_step == 0:
                self.setup_s = time.perf_counter() - process_started
                self.generated_at_start = generated_tokens(trainer)
                clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.trained_tokens += float(batch["loss_mask"].sum())
            if clock.after_step(trainer.global_step, pl_module.policy.state_dict):
                trainer.should_stop = True

        def on_train_end(self, trainer, pl_module):
            self.train_s = clock.elapsed()
            self.generated_at_end = generated_tokens(trainer)

    marks = Marks()
    trainer = fit_lit(overrides, seed, marks)
    return {
        "steps": trainer.global_step,
        "train_s": marks.train_s,
        "setup_s": marks.setup_s,
        "generated_tokens": marks.generated_at_end - marks.generated_at_start,
        "trained_tokens": marks.trained_tokens,
        "marks": clock.marks,
        "peak_memory_mb": peak_memory_mb(),
    }


def fit_lit(overrides: list[str], seed: int, callback) -> object:
    """This library's Hydra config with `overrides` fitted with `callback` beside its own (no warm start);
    the engines closed however it ends. Returns the trainer."""
    import lightning as L
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from lit_asyncrl.config_dir import config_dir
    from lit_asyncrl.lifecycle import quiet_known_warnings

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    quiet_known_warnings()
    L.seed_everything(seed, verbose=False)
    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    trainer = instantiate(cfg.trainer, _convert_="all", callbacks=[callback])
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        datamodule.rollouts.close()
    return trainer


def generated_tokens(trainer) -> float:
    """The policy tokens the run's engines have sampled so far (episodes dropped or pending included)."""
    producers = trainer.datamodule.rollouts.lanes.producers
    return float(sum(producer.stats.policy_tokens for producer in producers if producer is not None))


def evaluate(settings: BenchSettings, data: Path, start: Path, folders: list[Path]) -> dict[str, list[float]]:
    """The held-out success rate of every saved mark of a sums run: every held-out problem."""
    from lit_asyncrl.envs import DatasetEnv
    from lit_asyncrl.rollout.settings import RolloutConfig

    env = DatasetEnv(str(data), split_key="split", max_turn_tokens=settings.max_completion_tokens, turn_stop=ANSWER_END)
    rollout = RolloutConfig.from_keys(temperature=settings.temperature, kv_cache_gib=0.25, max_model_len=64)
    return evaluate_marks(env, rollout, len(read_rows(data, "test")), start, folders)


def evaluate_desk(settings: BenchSettings, start: Path, folders: list[Path]) -> dict[str, list[float]]:
    """The held-out success rate of every saved mark of a desk run, on `EVAL_INSTANCES` held-out requests."""
    from desk_task import EVAL_INSTANCES, desk_evaluation_env

    from lit_asyncrl.rollout.settings import RolloutConfig

    rollout = RolloutConfig.from_keys(temperature=settings.temperature, kv_cache_gib=0.25)
    return evaluate_marks(desk_evaluation_env(), rollout, EVAL_INSTANCES, start, folders)


def evaluate_marks(env, rollout, count: int, start: Path, folders: list[Path]) -> dict[str, list[float]]:
    """The held-out success rate of the start model and of every saved mark in `folders`
    (`mark_*.safetensors`) on `count` held-out instances of `env`, on one engine that takes each mark's
    weights in turn: this library's evaluator, the same for every library and mode."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from lit_asyncrl.rollout.serving.instances import held_out_instances
    from lit_asyncrl.rollout.serving.vllm_service import VLLMRolloutService

    service = VLLMRolloutService(start, env, rollout, seed=0)
    instances = held_out_instances(env, count)
    start_weights = AutoModelForCausalLM.from_pretrained(start).state_dict()
    service.start(start_weights, version=0, train=False)
    results: dict[str, list[float]] = {}
    version = 0
    try:
        results["start"] = [success_rate(service, instances)]
        for folder in folders:
            rates = []
            for mark in sorted(folder.glob("mark_*.safetensors")):
                version += 1
                service.publish_weights(load_file(str(mark)), version)
                rates.append(success_rate(service, instances))
            results[str(folder)] = rates
    finally:
        service.close()
    return results


def success_rate(service, instances) -> float:
    played = service.evaluate(instances, EVAL_SAMPLES, timeout_s=600.0)
    return float(played["success"].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["trl", "sync", "async", "evaluate", "trl-generate"])
    parser.add_argument("--settings", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--start", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--folders", type=Path, nargs="*", default=[])
    parser.add_argument("--task", choices=["sums", "desk"], default="sums")
    parser.add_argument("--extra", default="[]", help="more Hydra overrides of this library's run (a JSON list)")
    args = parser.parse_args()
    settings = BenchSettings.from_json(args.settings)
    # The same torch thread count for both libraries: one per core.
    torch.set_num_threads(os.cpu_count() or 1)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "evaluate":
        if args.task == "desk":
            rates = evaluate_desk(settings, args.start, args.folders)
        else:
            rates = evaluate(settings, args.data, args.start, args.folders)
        (args.out / "evaluation.json").write_text(json.dumps(rates))
        return
    if args.what == "trl-generate":
        result = trl_generation_speed(settings, args.data, args.start)
    elif args.what == "trl":
        result = run_trl(settings, args.seed, args.data, args.start, args.out)
    else:
        if args.task == "desk":
            from desk_task import DESK_OVERRIDES

            overrides = list(DESK_OVERRIDES)
        else:
            overrides = lit_overrides(settings, args.data)
        result = run_lit(settings, args.what, args.seed, args.start, [*overrides, *json.loads(args.extra)], args.out)
    (args.out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
