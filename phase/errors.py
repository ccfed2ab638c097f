"""The phase transaction's one exception type, so that this package depends on nothing of the runner's."""


class PhaseError(RuntimeError):
    """A prefill phase transaction failed at a named step; the host refuses work until reset."""
