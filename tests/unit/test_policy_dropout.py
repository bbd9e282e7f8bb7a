"""The library's own policy and the dedicated old-logit worker run without dropout, on a model whose
config turns it on (GPT-2's 0.1 defaults): scores equal a copy of the model in eval mode."""

import copy
import logging

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lit_asyncrl.models.policy import dropout_settings
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedScorer


def saved_gpt2_with_dropout(folder) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=23, n_positions=16, n_embd=16, n_layer=2, n_head=2, summary_first_dropout=0.2)
    )
    model.save_pretrained(folder)
    return model


def test_dropout_settings_are_found_by_name():
    config = GPT2Config(summary_first_dropout=0.2, attn_pdrop=0.0)
    assert dropout_settings(config) == {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "summary_first_dropout": 0.2}


def test_the_policy_is_loaded_without_dropout_and_a_note_says_so(tmp_path, caplog):
    saved_gpt2_with_dropout(tmp_path)
    with caplog.at_level(logging.INFO):
        module = AsyncRLModule(model_path=str(tmp_path))
    assert module.policy.training
    assert dropout_settings(module.policy.config) == {}
    assert all(layer.p == 0.0 for layer in module.policy.modules() if isinstance(layer, torch.nn.Dropout))
    input_ids = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(module.policy(input_ids).logits, module.policy(input_ids).logits)  # in training mode
    notes = [record.getMessage() for record in caplog.records if "dropout set to 0" in record.getMessage()]
    assert notes == [
        f"{tmp_path}: dropout set to 0 for RL (resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, summary_first_dropout=0.2): the engine samples without it"
    ]


def test_the_dedicated_worker_scores_like_an_eval_copy(tmp_path):
    model = saved_gpt2_with_dropout(tmp_path)
    scorer = DedicatedScorer(str(tmp_path), num_threads=1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.1)  # a later version than the saved one
    scorer.handle(("weights", 3, model.state_dict()))
    tokens = [5, 9, 2, 17, 4, 11]
    request_id, version, scores, _ = scorer.handle(("score", 7, [tokens], [[2, 3, 5]], 1.0, -1, 0))
    with torch.no_grad():
        logprobs = copy.deepcopy(model).eval()(torch.tensor([tokens])).logits.log_softmax(-1)[0]
    expected = [
        logprobs[position - 1, tokens[position]].item() for position in (2, 3, 5)
    ]  # each token given its prefix
    assert (request_id, version) == (7, 3)
    torch.testing.assert_close(torch.tensor(scores[0]), torch.tensor(expected), rtol=0, atol=1e-6)
