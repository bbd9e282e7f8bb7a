"""Loss strategies: the ratio algebra of the paper's Table 1 and of the peers' corrections.

    from lit_asyncrl.losses import LossInputs, get_loss
    loss_fn = get_loss("decoupled_ppo", discrepancy_bounds=(0.99, 1.01), clip_bounds=(0.997, 1.004))
    out = loss_fn(LossInputs(logprobs=..., behavior_logprobs=..., advantages=..., loss_mask=...))

See ``docs/losses.md`` for every strategy's formula, origin and arguments.
"""

from lit_asyncrl.losses.base import LossStrategy, TokenTerms
from lit_asyncrl.losses.bounds import EffectiveBounds, effective_bounds
from lit_asyncrl.losses.cispo import CISPO
from lit_asyncrl.losses.decoupled import DecoupledPPO
from lit_asyncrl.losses.dual_clip import DualClipPPO
from lit_asyncrl.losses.gppo import GPPO
from lit_asyncrl.losses.gspo import GSPO
from lit_asyncrl.losses.icepop import IcePop
from lit_asyncrl.losses.inputs import LossInputs, LossOutput
from lit_asyncrl.losses.m2po import M2PO
from lit_asyncrl.losses.mis import GeometricMIS, SequenceMIS
from lit_asyncrl.losses.ppo import PPOClip, PPOClipTrainInfer
from lit_asyncrl.losses.proximal import LinearProx, LinearProxTrainInfer, LogLinearProx, LogLinearProxTrainInfer
from lit_asyncrl.losses.registry import available_losses, get_loss, loss_class, register_loss
from lit_asyncrl.losses.tis import SequenceTIS, TokenTIS

__all__ = [
    "CISPO",
    "GPPO",
    "GSPO",
    "M2PO",
    "DecoupledPPO",
    "DualClipPPO",
    "EffectiveBounds",
    "GeometricMIS",
    "IcePop",
    "LinearProx",
    "LinearProxTrainInfer",
    "LogLinearProx",
    "LogLinearProxTrainInfer",
    "LossInputs",
    "LossOutput",
    "LossStrategy",
    "PPOClip",
    "PPOClipTrainInfer",
    "SequenceMIS",
    "SequenceTIS",
    "TokenTIS",
    "TokenTerms",
    "available_losses",
    "effective_bounds",
    "get_loss",
    "loss_class",
    "register_loss",
]
