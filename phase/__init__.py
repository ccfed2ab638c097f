"""The prefill phase transaction (release the expert cache, run the prompt, restore).

Empty until the offload issue lands; it will depend on small protocols, not on runner internals.
"""
