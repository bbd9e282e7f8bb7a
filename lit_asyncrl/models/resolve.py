"""Turn the `model.path` setting into a local Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path

from lit_asyncrl.models.tiny import TinyPolicyConfig, build_tiny_policy


def resolve_model_path(path: str | None, tiny: TinyPolicyConfig = TinyPolicyConfig()) -> Path:
    """`None` or "tiny" builds the built-in tiny policy; anything else must be a local model folder.

    Raises:
        ValueError: naming `model.path` when the folder does not exist or has no config.json
            (models cannot be downloaded at run time).
    """
    if path in (None, "", "tiny"):
        return build_tiny_policy(tiny)
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"model.path={path!r} is not a local Hugging Face model folder (no config.json there); "
            "set model.path (Lightning CLI: --model.model_path) to such a folder, or to null for the built-in tiny policy"
        )
    return folder
