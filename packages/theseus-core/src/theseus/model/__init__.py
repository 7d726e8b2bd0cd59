"""Language models (Flax linen), their configurable components, and the debugger.

``GPT`` is built from ``Component``s whose settings are configuration fields
(``architecture/n_layers``, ...). ``theseus.model.debug`` finds the calls of a module
type in a trainer's forward pass and replays one eagerly (``trainer.find`` and
``trainer.debug`` use it).
"""

from theseus.model.attention.base import (
    KVCache,
    SelfAttention,
    apply_rotary,
    causal_softmax,
)
from theseus.model.attention.rotary import RopeScaling
from theseus.model.component import Component, resolve_dtype
from theseus.model.config import AttentionConfig, GPTConfig, MLPConfig, ModelConfig
from theseus.model.debug import (
    DebugClosedError,
    DebugInputs,
    DebugLayer,
    DebugSession,
    DebugTargetError,
    UnknownArgumentError,
    UnknownPathError,
)
from theseus.model.models import (
    GPT,
    MLP,
    Block,
    ModelInputError,
    cross_entropy,
)

__all__ = [
    "GPT",
    "MLP",
    "AttentionConfig",
    "Block",
    "Component",
    "DebugClosedError",
    "DebugInputs",
    "DebugLayer",
    "DebugSession",
    "DebugTargetError",
    "GPTConfig",
    "KVCache",
    "MLPConfig",
    "ModelConfig",
    "ModelInputError",
    "RopeScaling",
    "SelfAttention",
    "UnknownArgumentError",
    "UnknownPathError",
    "apply_rotary",
    "causal_softmax",
    "cross_entropy",
    "resolve_dtype",
]
