"""The prefill phase transaction (release the expert cache, run the prompt, restore, all or nothing).

It depends on the small `PhaseHost` protocol, not on runner internals; the engine side implements
it (runner/offload/offload.py), the CUDA backend adds streams and graphs behind the same calls.
"""

from phase.cost import PhaseCostModel, PromptCost
from phase.errors import PhaseError
from phase.host import PhaseHost, WarmExperts
from phase.transaction import STEPS, PhaseCounters, PhaseRecord, PrefillPhase

__all__ = ["PhaseCostModel", "PhaseCounters", "PhaseError", "PhaseHost", "PhaseRecord", "PrefillPhase", "PromptCost", "STEPS",
           "WarmExperts"]
