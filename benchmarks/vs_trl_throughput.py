"""Throughput on a real chat model, TRL's GRPOTrainer against this library, a few steps each in a process of
its own (`bench_vs_trl.py --throughput` runs them):

    python benchmarks/vs_trl_throughput.py trl|sync|async --steps N --seed S --data FILE --out DIR

SmolLM2-135M-Instruct (fp32) on the arithmetic word problems of `lit_asyncrl.examples.word_problems`, as
`experiment=smollm2_dataset` runs them: 2 prompts x 4 samples per step, at most 40 completion tokens at
temperature 0.7, learning rate 1e-5, the last 2 of 30 layers and the final norm trained (the same function
freezes the rest for TRL), no KL term. TRL generates with transformers' `generate` (KV cache on); its
reward is 1 when the row's answer appears in the completion (a throughput figure does not depend on it);
ours is `math_verify`, as the experiment has it. The first step is a warm-up in both: the clock starts as
it ends and stops after the last; `result.json` holds the steps measured, their time, the completion tokens
generated and trained in them and the trainer process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from vs_trl_runs import QUIET_TRAINER, TRL_AS_OURS, fit_lit, generated_tokens, peak_memory_mb

PROMPTS_PER_STEP, SAMPLES_PER_PROMPT, MAX_COMPLETION_TOKENS = 2, 4, 40
TEMPERATURE, LEARNING_RATE, TRAINED_LAST_LAYERS = 0.7, 1e-5, 2


def run_trl(steps: int, seed: int, data: Path, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_asyncrl.models import resolve_model_path
    from lit_asyncrl.module import freeze_all_but_last_layers

    folder = resolve_model_path("smollm2_135m")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    freeze_all_but_last_layers(model, TRAINED_LAST_LAYERS)
    clock = {"started": 0.0, "generated": 0.0}

    def answer_given(completions, answer, **_):
        return [float(str(expected) in completion[0]["content"]) for completion, expected in zip(completions, answer)]

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the warm-up step ends
                clock["started"] = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and state.global_step > 1:
                clock["generated"] += float(logs["completions/mean_length"]) * PROMPTS_PER_STEP * SAMPLES_PER_PROMPT

    rows = [json.loads(line) for line in data.read_text().splitlines()]
    train = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": row["prompt"]}], "answer": row["answer"]}
            for row in rows
            if row["split"] == "train"
        ]
    )
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
        num_generations=SAMPLES_PER_PROMPT,
        max_completion_length=MAX_COMPLETION_TOKENS,
        temperature=TEMPERATURE,
        learning_rate=LEARNING_RATE,
        max_steps=steps,
        seed=seed,
        **TRL_AS_OURS,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[answer_given],
        args=config,
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(folder),
        callbacks=[Clock()],
    )
    trainer.train()
    seconds = time.perf_counter() - clock["started"]
    return {
        "steps": trainer.state.global_step - 1,
        "train_s": seconds,
        "generated_tokens": clock["generated"],
        "trained_tokens": clock["generated"],
        "peak_memory_mb": peak_memory_mb(),
    }


def run_lit(mode: str, steps: int, seed: int, data: Path, out: Path) -> dict:
    import lightning as L

    overrides = [
        "experiment=smollm2_dataset",
        f"seed={seed}",
        f"env.path={data}",
        f"rollout.mode={mode}",
        f"trainer.max_steps={steps}",
        *QUIET_TRAINER,
        f"trainer.default_root_dir={out / 'lit'}",
    ]

    class Clock(L.Callback):
        started = seconds = trained = 0.0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 1:  # the warm-up step ends
                self.started = time.perf_counter()
                self.generated_at_start = generated_tokens(trainer)
                return
            self.trained += float(batch["loss_mask"].sum())

        def on_train_end(self, trainer, pl_module):
            self.seconds = time.perf_counter() - self.started
            self.generated_at_end = generated_tokens(trainer)

    clock = Clock()
    trainer = fit_lit(overrides, seed, clock)
    return {
        "steps": trainer.global_step - 1,
        "train_s": clock.seconds,
        "generated_tokens": clock.generated_at_end - clock.generated_at_start,
        "trained_tokens": clock.trained,
        "peak_memory_mb": peak_memory_mb(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["trl", "sync", "async"])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "trl":
        result = run_trl(args.steps, args.seed, args.data, args.out)
    else:
        result = run_lit(args.what, args.steps, args.seed, args.data, args.out)
    (args.out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
