"""A run's trained policy out of its checkpoint, as a folder vLLM, transformers and peft load:
`lit-asyncrl export CKPT --out DIR` (or `python -m lit_asyncrl.export`).

- `checkpoint.py`: reads a checkpoint of this library back into its policy (and the PPO-EWMA average);
- `folders.py`: writes the policy as a Hugging Face folder, a peft adapter folder or a merged folder;
- `model_card.py`: the folder's README.md, with the run's config and its final metrics;
- `main.py`: the command, its refusals before any work, and what it wrote.
"""
