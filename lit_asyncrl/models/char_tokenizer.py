"""A character-level Hugging Face tokenizer for the built-in tiny policy.

One token per character keeps the vocabulary tiny (100 entries: 4 special tokens, newline and the
95 printable ASCII characters) and makes every number the agent writes a short, explicit sequence
of digit tokens. It is a real `PreTrainedTokenizerFast`, saved in the model folder, so vLLM and
transformers load it like any other tokenizer. A character outside the vocabulary becomes `<unk>`,
which `lit_asyncrl.text.encode_text` refuses with an error naming the character.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD = "<pad>"
BOS = "<bos>"
EOS = "<eos>"
UNK = "<unk>"
CHARACTERS = "\n" + "".join(chr(code) for code in range(32, 127))  # newline + printable ASCII
VOCAB: list[str] = [PAD, BOS, EOS, UNK, *CHARACTERS]
assert set(string.printable) - set(CHARACTERS) == set("\t\r\x0b\x0c")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Return the character tokenizer (ids are positions in `VOCAB`)."""
    vocab = {token: index for index, token in enumerate(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every single character (newline included) becomes its own pre-token, hence its own token.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )
