"""Put gemv.cu's K-quant scale decode back as it was before 3ab7e4f (a branch and runtime word selects), in the copy
of the tree given: gpu-call-46b.sh's `old` arm times main against it. Delete this file once that is measured.

    python3 docs/wip/old_k_scale.py /tmp/oldtree/cuda/gemv.cu
"""

import sys
from pathlib import Path

OLD_BODY = """    int scale, min;
    if (sub < 4) {
        scale = byte_of(head, 4 + sub) & 63;
        min = byte_of(head, 8 + sub) & 63;
    } else {
        scale = (byte_of(head, 8 + sub) & 0xF) | ((byte_of(head, sub) >> 6) << 4);
        min = (byte_of(head, 8 + sub) >> 4) | ((byte_of(head, 4 + sub) >> 6) << 4);
    }
"""
HEAD = "__device__ __forceinline__ void k_scale_min_of(const uint4& head, int sub, float& dl, float& ml) {\n"
TAIL = "    dl = __fmul_rn(f16_low(head.x), (float)scale);\n"

path = Path(sys.argv[1])
source = path.read_text()
start = source.index(HEAD) + len(HEAD)
end = source.index(TAIL, start)
assert source.count(HEAD) == 1 and "const bool low = sub < 4;" in source[start:end], "not the branch-free decode"
path.write_text(source[:start] + OLD_BODY + source[end:])
