"""One exception type per domain; each message is a single line a user can act on."""

from phase.errors import PhaseError


class RunnerError(Exception):
    """Base of every error the CLI and server turn into a one-line message."""


class ModelFileError(RunnerError):
    """The GGUF file is missing, foreign, truncated, or not a model this runner supports."""


class TokenizerError(RunnerError):
    """The vocabulary or chat template cannot do what was asked."""


class GenerationError(RunnerError):
    """A request the engine cannot serve as given (prompt too long, bad sampling settings)."""


class SynthError(RunnerError):
    """A synthetic model cannot be written with the requested settings."""


class ChatError(RunnerError):
    """A chat request or command that cannot be done as asked (full context, bad session file)."""


class ServeError(RunnerError):
    """The server cannot start as asked (address in use, bad settings)."""


class DeviceMemoryError(RunnerError):
    """An allocation does not fit the device memory budget."""


class CacheError(RunnerError):
    """The expert store or slot cache cannot be set up or used as asked (slot count, pinning, batch size)."""


class ProfileError(RunnerError):
    """A launch profile is missing or malformed, or the explicit settings contradict it."""


# What the CLI and the server turn into one line (or an OpenAI-shaped error); the phase transaction's
# error comes from phase/, which depends on nothing of the runner's.
USER_ERRORS: tuple[type[Exception], ...] = (RunnerError, PhaseError)
