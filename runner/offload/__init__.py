"""Routed experts off the GPU: the host store, the per-layer slot cache, prefill streaming.

The model definition never sees where experts live: `ops.moe` asks the backend's `experts`
provider (provider.py) for the bytes of the experts a batch routed to.
"""
