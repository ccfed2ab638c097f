"""Batch limits the backends and the offload sizing must agree on; imports nothing, so numpy-only code,
CUDA code and the offload arithmetic can all share them."""

# Decode and speculative-verify batches: up to this many rows every op takes its batch-invariant path
# (row-by-row products and attention on numpy, GEMV and split-KV attention on CUDA), so a verified
# token gets the bits it would get decoded alone and MTP stays lossless. cuda/gemv.cu's register tiles
# are compiled for it (GEMV_MAX_ROWS), and offload sizes the decode workspaces and the batches it sends
# through the slot cache by it.
SMALL_BATCH_ROWS = 8

# Keys per split of the decode attention kernel (cuda/attention.cu's KV_CHUNK). Fixed, so a row's bits
# do not depend on the cache's length; the offload sizing counts the split partials a decode graph keeps
# (its attention spans the whole cache buffer: n_ctx / DECODE_KV_CHUNK partials per row and head).
DECODE_KV_CHUNK = 128

# Layer-major prompts run each layer's feed-forward half over this many tokens at once (several
# micro-batches), so each routed expert's matrices are read and dequantized once per group rather
# than once per micro-batch; the offload's prefill buffers are sized for it.
PROMPT_FFN_GROUP_TOKENS = 16384

# Tokens per chunk of the chunked Gated DeltaNet on CUDA (cuda/delta_net_chunked.cu's DNC_CHUNK): a hybrid
# prompt's micro-batch takes scratch per padded chunk (U and W per value dim, P and G per value head), which
# the offload's prefill buffers count.
DELTA_RULE_CHUNK = 64
