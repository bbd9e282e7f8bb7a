"""The tiny policy's folder and tokenizer as session fixtures (a pytest plugin of the root conftest),
and the token ids the tests' hand-written values rely on.

Imported by every pytest process (the xdist controller too, before it starts its workers), so
transformers and the model code are imported by the fixtures, not here."""

import pytest

# character c has id ord(c) - 27
BOS, EOS, SEMI, QUESTION, LETTER_A = 1, 2, 32, 36, 70


@pytest.fixture(scope="session")
def model_path():
    from lit_asyncrl.models import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    assert (tok.bos_token_id, tok.eos_token_id) == (BOS, EOS)
    assert tok.encode("5;?a", add_special_tokens=False) == [26, SEMI, QUESTION, LETTER_A]
    return tok
