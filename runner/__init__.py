"""An offload runner for Mixture-of-Experts models in GGUF files."""

__version__ = "0.1.0"
