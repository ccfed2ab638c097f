"""scripts/bench/sass_counts: counting cuobjdump's SASS text (a canned listing here; the build needs nvcc)."""

from __future__ import annotations

from scripts.bench.sass_counts import count

LISTING = """
\tcode for sm_90
\t\tFunction : first
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000e240000000800 */
        /*0010*/                   IADD3 R1, R1, -0x10, RZ ;              /* 0xfffffff001017810 */
        /*0020*/                   FFMA R2, R3, R4, R2 ;                  /* 0x0000000403027223 */
        /*0030*/                   FFMA R2, R3, R4, R2 ;                  /* 0x0000000403027223 */
        /*0040*/              @!P0 BRA 0x10 ;                             /* 0xfffffffc00d88947 */
        /*0050*/               @P1 BRA 0x70 ;                             /* 0x0000000000601947 */
        /*0060*/                   EXIT ;                                 /* 0x000000000000794d */
        /*0070*/                   BRA 0x70;                              /* 0xfffffffc00fc7947 */
\t\t..........
\t\tFunction : second
        /*0000*/                   EXIT ;                                 /* 0x000000000000794d */
"""


def test_each_function_counts_its_instructions_and_its_largest_loop() -> None:
    counts = count(LISTING)
    # first: 8 instructions; 0x40 -> 0x10 is a loop of 4 (0x10..0x40); the forward branch and the self-branch
    # at the end (0x70 -> 0x70, not earlier) are not loops
    assert counts == {"first": {"instructions": 8, "largest_loop": 4}, "second": {"instructions": 1, "largest_loop": 0}}
