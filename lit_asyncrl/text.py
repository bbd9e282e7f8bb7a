"""Text to token ids for episodes: never a silent `<unk>`."""

from __future__ import annotations

from typing import Any


class UnencodableTextError(ValueError):
    """The policy's tokenizer has no token for some characters of an environment's text."""


def encode_text(tokenizer: Any, text: str, source: str = "environment text") -> list[int]:
    """Token ids of `text` without special tokens; raises instead of mapping characters to `<unk>`.

    Byte-level tokenizers (the real models') encode everything; the tiny policy's character
    tokenizer covers printable ASCII and newline, so a prompt with other characters fails here
    with the characters named, not as a policy that silently reads padding.

    Raises:
        UnencodableTextError: naming `source` and the characters the tokenizer cannot encode.
    """
    if not text:
        return []
    ids = tokenizer.encode(text, add_special_tokens=False)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids and tokenizer.unk_token not in text:
        missing = sorted({char for char in text if tokenizer.encode(char, add_special_tokens=False) == [unk]})
        raise UnencodableTextError(
            f"{source} has characters the policy's tokenizer cannot encode: {missing!r} (in {text[:80]!r}); "
            "the built-in tiny policy covers printable ASCII and newline: "
            "change the text or use a model with a byte-level tokenizer"
        )
    return ids


def pad_token_id(tokenizer: Any) -> int:
    """The id that pads batches: the tokenizer's pad token, else its EOS (many chat models have no
    pad token; padded positions are masked out of attention and loss, so any id works)."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    if tokenizer.eos_token_id is None:
        raise ValueError("the policy's tokenizer has neither a pad nor an EOS token to pad batches with")
    return tokenizer.eos_token_id
