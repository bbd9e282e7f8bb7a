"""The library's own policy and the dedicated old-logit worker run without dropout, on a model whose
config turns it on (GPT-2's 0.1 defaults): scores equal a copy of the model in eval mode. With a LoRA
adapter's dropout (the one dropout a run may keep), the references get the eval-mode log-probs."""

import copy
import logging

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from lit_asyncrl.models.lora import LoRASettings, add_adapter
from lit_asyncrl.models.policy import dropout_settings
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference import InterruptSyncReference
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedScorer
from lit_asyncrl.scoring import live_logprobs_without_dropout, token_logprobs


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


def test_the_references_get_the_live_weights_without_dropout_when_a_lora_adapter_drops(model_path):
    # model.lora.dropout above 0: the training forward drops the adapter's inputs, so interruption-sync's
    # pi_old for the version being trained (and the snapshot reference's newest version) come from an
    # eval-mode forward of the live weights, the policy left in training mode.
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    policy = add_adapter(base, LoRASettings(rank=8, dropout=0.5))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)  # peft starts B at 0: the adapter would change nothing
    policy.train()
    input_ids = torch.randint(3, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "temperature": 1.0, "top_k": -1}
    training = token_logprobs(policy, input_ids, batch["attention_mask"], 1.0)
    with torch.no_grad():
        expected = token_logprobs(copy.deepcopy(policy).eval(), input_ids, batch["attention_mask"], 1.0)
    assert (training - expected).abs().max() > 1e-2  # the dropout is real

    live = live_logprobs_without_dropout(policy, batch, training)
    torch.testing.assert_close(live, expected, rtol=0, atol=1e-6)
    assert policy.training and not live.requires_grad
    # Interruption-sync: rows of the trained version (3) without pi_old take the live log-probs; others keep theirs.
    old_logprobs = torch.full_like(expected, float("nan"))
    old_logprobs[1] = -1.5
    versions = torch.tensor([[3] * 9, [2] * 9])
    pi_old = InterruptSyncReference().ref_logprobs({"old_logprobs": old_logprobs, "versions": versions}, live, 3)
    torch.testing.assert_close(pi_old[0], expected[0], rtol=0, atol=1e-6)
    assert torch.equal(pi_old[1], torch.full((9,), -1.5))


def test_without_dropout_the_training_forwards_log_probs_stand_in(model_path):
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    input_ids = torch.randint(3, 20, (2, 9), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "temperature": 1.0, "top_k": -1}
    training = token_logprobs(policy, input_ids, batch["attention_mask"], 1.0)
    live = live_logprobs_without_dropout(policy, batch, training)
    assert torch.equal(live, training.detach()) and not live.requires_grad
