"""The training step keeps logits only from the position before the batch's first policy token on."""

import torch

from lit_asyncrl.models.policy import load_policy
from lit_asyncrl.scoring import policy_logits, token_logprobs


def test_only_positions_from_before_the_first_policy_token_are_kept_and_they_score_as_in_full(model_path):
    torch.manual_seed(0)
    policy = load_policy(model_path).eval()
    input_ids = torch.randint(3, 40, (2, 12))
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    loss_mask[0, 7:9] = True  # the first policy token of the batch is at 5 (row 1): logits from 4 on
    loss_mask[1, 5:12] = True
    with torch.no_grad():
        logits, start = policy_logits(policy, input_ids, attention_mask, loss_mask)
        full = token_logprobs(policy, input_ids, attention_mask, temperature=1.0)
    assert start == 4 and logits.shape == (2, 8, policy.config.vocab_size)
    kept = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 5:, None]).squeeze(-1)
    torch.testing.assert_close(kept, full[:, 5:], rtol=0, atol=1e-6)  # positions 5..11 from logits 4..10
    no_policy = torch.zeros_like(loss_mask)
    with torch.no_grad():
        assert policy_logits(policy, input_ids, attention_mask, no_policy)[1] == 0  # nothing to score: all kept
