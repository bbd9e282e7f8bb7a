"""A character-level Hugging Face tokenizer for the built-in tiny policy.

One token per character keeps the vocabulary tiny (64 entries) and makes every number the agent
writes a short, explicit sequence of digit tokens. It is a real `PreTrainedTokenizerFast`, saved in
the model folder, so vLLM and transformers load it like any other tokenizer.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
_CHARACTERS = "0123456789;?HLW =+-*/.,:!()abcdefghijklmnopqrstuvwxyzABCDEFG"
VOCAB: list[str] = [PAD, BOS, EOS, *_CHARACTERS][:64]


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Return the 64-token character tokenizer (ids are positions in `VOCAB`)."""
    vocab = {token: index for index, token in enumerate(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Every single character becomes its own pre-token, hence its own token.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=PAD)
