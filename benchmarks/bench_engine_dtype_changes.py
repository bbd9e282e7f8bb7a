"""What a full fine-tune changes in a bf16 engine's weights per version: tensors and elements.

A changed-only push of a full fine-tune (every parameter trains) could send only the tensors, or only
the elements, whose values *in the engine's dtype* differ from what the engine holds. This measures how
much that would be: a model is trained with AdamW on next-token loss over random tokens (the update's size
is what matters, not the task), and after each optimizer step its parameters are cast to bf16 and compared
with the bf16 weights of the previous version (what the engine holds after the previous push). Printed per
learning rate: the share of tensors with at least one changed element and the share of elements changed,
median over the steps after the first (AdamW's first step is larger than its steady state), the share of the model's bytes
in the changed tensors (what a push of whole changed tensors sends), and the bytes a
push of only the changed elements would send (a 4-byte index and a 2-byte value each) against the whole
bf16 model.

    .venv/bin/python benchmarks/bench_engine_dtype_changes.py             # the tiny policy, then SmolLM2-135M
    .venv/bin/python benchmarks/bench_engine_dtype_changes.py --tiny-only
"""

from __future__ import annotations

import argparse
import statistics

import torch
import transformers
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path


def measure(model_path: str, lr: float, steps: int, batch: int, length: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    vocab = model.config.vocab_size
    held = {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}  # the engine's copy
    tensors, tensor_bytes, elements = [], [], []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch, length))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        changed_tensors = changed_elements = changed_tensor_elements = total = 0
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                now = parameter.detach().to(torch.bfloat16)
                changed = int((now != held[name]).sum())
                changed_tensors += changed > 0
                changed_tensor_elements += now.numel() if changed else 0
                changed_elements += changed
                total += now.numel()
                held[name] = now
        tensors.append(changed_tensors / len(held))
        tensor_bytes.append(changed_tensor_elements / total)
        elements.append(changed_elements / total)
    later = slice(1, None)
    share = statistics.median(elements[later])
    return {
        "tensors": statistics.median(tensors[later]),
        "tensor_bytes": statistics.median(tensor_bytes[later]),
        "elements": share,
        "first_step_elements": elements[0],
        "sparse_bytes_over_dense": share * (4 + 2) / 2,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-only", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    transformers.logging.disable_progress_bar()
    runs = [("tiny policy", resolve_model_path(None), (2e-6, 6e-5, 2e-4), 8, 64)]
    if not args.tiny_only:
        runs.append(("SmolLM2-135M", resolve_model_path("smollm2_135m"), (1e-6, 1e-5), 1, 32))
    print(
        f"{'model':<14} {'lr':>7} {'tensors changed':>16} {'their bytes':>12} {'elements changed':>17} {'(first step)':>13} "
        f"{'sparse push / bf16 model':>25}"
    )
    for label, path, rates, batch, length in runs:
        for lr in rates:
            result = measure(path, lr, args.steps, batch, length)
            print(
                f"{label:<14} {lr:>7.0e} {result['tensors']:>16.3f} {result['tensor_bytes']:>12.4f} {result['elements']:>17.4f} "
                f"{result['first_step_elements']:>13.4f} {result['sparse_bytes_over_dense']:>25.4f}"
            )


if __name__ == "__main__":
    main()
