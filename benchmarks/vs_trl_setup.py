"""What both libraries share in `bench_vs_trl.py`: the settings, the dataset file, the start model, and the
clock that saves the policy at wall-clock marks.

The task is addition written the tiny policy's way ("137+6=" -> "143"): 2,000 problems, about a tenth held
out by a hash of the prompt. Both libraries start from the same model: the tiny policy fine-tuned here,
in plain PyTorch, on the training problems until a fifth or so of the held-out answers come out right,
so that reinforcement learning has a signal from its first step and room above it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

#: The two terms of a problem: a in [0, 200), b in [0, 10).
FIRST_TERMS, SECOND_TERMS = 200, 10
#: An answer ends with the end-of-sequence token, where transformers' `generate` stops; this library's
#: task is told it is the turn's end (`env.turn_stop`), as the tiny policy has no chat template.
ANSWER_END = "<eos>"
#: The tiny policy reads a text after its BOS token (this library's plain episode format adds it); TRL's
#: prompts are text given to the tokenizer as it is, so they carry it written out.
PROMPT_START = "<bos>"


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """The settings both libraries run with (what cannot be matched is named in the report)."""

    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    learning_rate: float = 3e-4
    #: An answer is at most 3 digits and the end-of-sequence token.
    max_completion_tokens: int = 4
    temperature: float = 1.0
    #: Each run trains for this long (from its first step; its start-up is timed apart).
    budget_s: float = 240.0
    #: The policy is saved every this many seconds of training (the saving's own time not counted).
    mark_s: float = 20.0
    #: Supervised steps from the tiny policy to the shared start model.
    start_steps: int = 700
    #: Seconds each environment answer (here: the reward of an episode) waits, in this library's runs.
    latency_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchSettings:
        return cls(**json.loads(text))


def shared_overrides(settings: BenchSettings, mode: str, seed: int, start: Path) -> list[str]:
    """This library's Hydra overrides of a run in `mode` (sync or async) from the start model `start` (no
    warm start: it had one), whatever the task: the learning rate, sampling, batch, and environment latency."""
    return [
        f"seed={seed}",
        f"model.path={start}",
        "model.warm_start_steps=0",
        f"model.lr={settings.learning_rate}",
        f"env.latency_s={settings.latency_s}",
        f"rollout.mode={mode}",
        f"rollout.group_size={settings.samples_per_prompt}",
        f"rollout.groups_per_batch={settings.prompts_per_step}",
        f"rollout.temperature={settings.temperature}",
        "rollout.kv_cache_gib=0.25",
        "trainer.max_steps=1000000",
    ]


def is_held_out(prompt: str) -> bool:
    return zlib.crc32(prompt.encode()) % 10 == 0


def write_sums(path: Path) -> None:
    """The dataset file both libraries read: `prompt`, `answer` and `split` per row."""
    rows = []
    for a in range(FIRST_TERMS):
        for b in range(SECOND_TERMS):
            prompt = f"{a}+{b}="
            rows.append({"prompt": prompt, "answer": str(a + b), "split": "test" if is_held_out(prompt) else "train"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_rows(path: Path, split: str) -> list[dict]:
    return [row for row in map(json.loads, path.read_text().splitlines()) if row["split"] == split]


def write_start_model(data: Path, out: Path, steps: int, seed: int = 0) -> None:
    """The tiny policy after `steps` supervised steps (batches of 64 training problems, answer and
    end-of-sequence token in the loss) saved as a model folder with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_asyncrl.models import resolve_model_path

    tiny = resolve_model_path(None)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rows = read_rows(data, "train")
    rng = random.Random(seed)
    for _ in range(steps):
        batch = [rng.choice(rows) for _ in range(64)]
        ids, attention, labels = _supervised_batch(tokenizer, batch)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _supervised_batch(tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    prompts = [[tokenizer.bos_token_id, *tokenizer.encode(row["prompt"], add_special_tokens=False)] for row in rows]
    answers = [[*tokenizer.encode(row["answer"], add_special_tokens=False), tokenizer.eos_token_id] for row in rows]
    length = max(len(p) + len(a) for p, a in zip(prompts, answers))
    ids = torch.full((len(rows), length), tokenizer.pad_token_id)
    labels = torch.full((len(rows), length), -100)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for row, (prompt, answer) in enumerate(zip(prompts, answers)):
        sequence = prompt + answer
        ids[row, : len(sequence)] = torch.tensor(sequence)
        attention[row, : len(sequence)] = 1
        labels[row, len(prompt) : len(sequence)] = torch.tensor(answer)
    return ids, attention, labels


class MarkClock:
    """Training time since `start`, less the time spent saving; saves the policy at each mark and says when
    the budget is spent."""

    def __init__(self, settings: BenchSettings, out: Path) -> None:
        self.settings = settings
        self.out = out
        self.started = 0.0
        self.saving_s = 0.0
        self.marks: list[dict] = []

    def start(self) -> None:
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started - self.saving_s

    def after_step(self, step: int, state_dict: Callable[[], dict[str, torch.Tensor]]) -> bool:
        """Save at every mark passed since the last save (once); True when the budget is spent."""
        elapsed = self.elapsed()
        due = int(min(elapsed, self.settings.budget_s) // self.settings.mark_s)
        if due > len(self.marks):
            saving = time.perf_counter()
            from safetensors.torch import save_file

            weights = {name: tensor.detach().contiguous().clone() for name, tensor in state_dict().items()}
            path = self.out / f"mark_{due:03d}.safetensors"
            save_file(weights, str(path))
            self.marks.append(
                {"mark_s": due * self.settings.mark_s, "elapsed_s": elapsed, "step": step, "file": path.name}
            )
            self.saving_s += time.perf_counter() - saving
        return elapsed >= self.settings.budget_s
