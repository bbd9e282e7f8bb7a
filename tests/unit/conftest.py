"""Fixtures of the engine-free unit tests: the tiny policy's folder and tokenizer."""

import pytest
from transformers import AutoTokenizer

from lit_asyncrl.models import resolve_model_path

BOS, EOS, SEMI, QUESTION, LETTER_A = 1, 2, 32, 36, 70


@pytest.fixture(scope="session")
def model_path():
    return resolve_model_path(None)


@pytest.fixture(scope="session")
def tokenizer(model_path):
    tok = AutoTokenizer.from_pretrained(model_path)
    # the ids the tests' hand-written values rely on: character c has id ord(c) - 27
    assert (tok.bos_token_id, tok.eos_token_id) == (BOS, EOS)
    assert tok.encode("5;?a", add_special_tokens=False) == [26, SEMI, QUESTION, LETTER_A]
    return tok
