"""The prefill phase transaction (release the expert cache, run the prompt, restore, all or nothing).

It depends on the small `PhaseHost` protocol, not on runner internals; the engine side implements
it (runner/experts/offload.py), the CUDA backend adds streams and graphs behind the same calls.
"""

from .cost import PhaseCostModel, PromptCost
from .host import PhaseHost, WarmExperts
from .transaction import STEPS, PhaseCounters, PhaseRecord, PrefillPhase

__all__ = ["PhaseCostModel", "PhaseCounters", "PhaseHost", "PhaseRecord", "PrefillPhase", "PromptCost", "STEPS",
           "WarmExperts"]
