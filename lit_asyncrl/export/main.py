"""`lit-asyncrl export CKPT --out DIR [--merge] [--weights live|ewma] [--force]`.

- A run that trained the model's weights (all of them, or its last layers) becomes a Hugging Face
  folder: config, safetensors, the tokenizer with its chat template, the generation config.
- A LoRA run becomes a peft adapter folder. Its `base_model_name_or_path` is the model folder the
  run loaded; the built-in tiny policy and SmolLM2 (which live in this library's cache) are copied
  into `DIR/base` and named there. `--merge` writes the adapter merged into its base instead: a full
  folder, as for a run without an adapter.
- `--weights ewma` exports the PPO-EWMA reference's average of the trained tensors in place of the
  live ones (a run with `reference=ewma`).

Every folder carries a README.md (the run's settings and its last logged metrics). Refused before
any work: a file that is not this library's checkpoint, an output folder that exists and is not
empty (without `--force`), `--merge` for a run without an adapter.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lit_asyncrl.export.checkpoint import RunCheckpoint, read_checkpoint, restored_policy
from lit_asyncrl.export.folders import copy_base, with_weights, write_adapter, write_model
from lit_asyncrl.export.model_card import model_card
from lit_asyncrl.model_path import NAMED_MODELS


def parser() -> argparse.ArgumentParser:
    described = argparse.ArgumentParser(
        prog="lit-asyncrl export",
        description="Write a run's trained policy from its checkpoint as a folder vLLM, transformers and peft load.",
    )
    described.add_argument("checkpoint", metavar="CKPT", help="a checkpoint of a run (e.g. RUN/checkpoints/last.ckpt)")
    described.add_argument("--out", required=True, type=Path, help="the folder to write (made; must be empty)")
    described.add_argument("--merge", action="store_true", help="a LoRA run: the adapter merged into its base")
    described.add_argument(
        "--weights",
        choices=("live", "ewma"),
        default="live",
        help="live: the policy's weights (default); ewma: the PPO-EWMA reference's average",
    )
    described.add_argument("--force", action="store_true", help="write into an output folder that is not empty")
    return described


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Every refusal before the policy is built.
    if args.out.exists() and not args.out.is_dir():
        raise SystemExit(f"--out {args.out}: a file, not a folder")
    if args.out.exists() and any(args.out.iterdir()) and not args.force:
        raise SystemExit(
            f"--out {args.out}: a folder that is not empty (--force writes into it, over files of the same names)"
        )
    checkpoint = read_checkpoint(args.checkpoint)
    if args.merge and checkpoint.lora_rank == 0:
        raise SystemExit(f"--merge: {args.checkpoint} trained the model's weights, not a LoRA adapter; leave it out")
    average = checkpoint.ewma_average() if args.weights == "ewma" else None
    kind = export(checkpoint, args.out, merge=args.merge, average=average)
    print(f"wrote {kind} to {args.out}")
    return 0


def export(checkpoint: RunCheckpoint, out: Path, merge: bool, average: dict | None) -> str:
    """Write the checkpoint's policy to `out`; what was written (`model`, `adapter`, `merged model`)."""
    from transformers import AutoTokenizer

    from lit_asyncrl.models.lora import is_adapted, merged_weights
    from lit_asyncrl.models.policy import load_policy
    from lit_asyncrl.models.resolve import resolve_model_path

    model_path = checkpoint.hyper_parameters["model_path"]
    model = resolve_model_path(model_path)  # a folder, or a hub id transformers finds in its cache
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = restored_policy(checkpoint)
    if average is not None:
        with_weights(policy, average)
    if not is_adapted(policy):
        kind = "model"
        write_model(policy, tokenizer, out)
    elif merge:
        kind = "merged model"
        base = load_policy(model)
        base.load_state_dict(merged_weights(policy))
        write_model(base, tokenizer, out)
    else:
        kind = "adapter"
        out.mkdir(parents=True, exist_ok=True)
        base_model = str(copy_base(Path(model), out).resolve()) if model_path in NAMED_MODELS else str(model)
        write_adapter(policy, tokenizer, base_model, out)
    if average is not None:
        kind += " (the PPO-EWMA average)"
    run_dir = checkpoint.path.parent.parent if checkpoint.path.parent.name == "checkpoints" else None
    card = model_card(kind, checkpoint.path, checkpoint.global_step, checkpoint.hyper_parameters, run_dir)
    (out / "README.md").write_text(card)
    return kind
