"""The tiny policy's folder and tokenizer as session fixtures (a pytest plugin of the root conftest),
and the token ids the tests' hand-written values rely on."""

import pytest
from transformers import AutoTokenizer

from lit_asyncrl.models import resolve_model_path

# character c has id ord(c) - 27
BOS, EOS, SEMI, QUESTION, LETTER_A = 1, 2, 32, 36, 70


@pytest.fixture(scope="session")
def model_path():
    return resolve_model_path(None)


@pytest.fixture(scope="session")
def tokenizer(model_path):
    tok = AutoTokenizer.from_pretrained(model_path)
    assert (tok.bos_token_id, tok.eos_token_id) == (BOS, EOS)
    assert tok.encode("5;?a", add_special_tokens=False) == [26, SEMI, QUESTION, LETTER_A]
    return tok
