"""Does TRL 1.16.0's vLLM colocate mode run unpatched on this machine's CPU vLLM? Two steps on a start model
folder of `bench_vs_trl.py` (its `start/`):

    python benchmarks/trl_colocate_check.py outputs/vs_trl_quick/start

Prints `COLOCATE RAN <steps>` or `COLOCATE FAILED: <error>` after the traceback.
"""

import sys
import traceback
from pathlib import Path

if __name__ == "__main__":
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    start = Path(sys.argv[1])
    rows = [{"prompt": "<bos>1+2=", "answer": "3"}] * 64
    config = GRPOConfig(
        output_dir=str(start.parent / "colocate"),
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=4,
        max_steps=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.1,
        disable_tqdm=True,
    )
    try:
        trainer = GRPOTrainer(
            model=str(start),
            reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(start),
        )
        trainer.train()
        print("COLOCATE RAN", trainer.state.global_step)
    except Exception as error:
        traceback.print_exc()
        print("COLOCATE FAILED:", type(error).__name__, str(error)[:500])
