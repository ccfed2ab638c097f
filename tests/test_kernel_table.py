"""scripts/bench/kernel_table.py reads ncu's raw CSV (program output and ==PROF== lines mixed in) and sums by name."""

import pytest

from scripts.bench.kernel_table import launches, table

RAW = '''==PROF== Connected to process 1234
{"decode_tok_s": {"1024": 190.0}}
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","nsecond"
"0","1234","python3","box","gemv_r1","1","7","(128, 1, 1)","(256, 1, 1)","0","9.0","10,240"
"1","1234","python3","box","expert_gate_up","1","7","(128, 1, 1)","(64, 11, 1)","0","9.0","20480"
"2","1234","python3","box","gemv_r1","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","5120"
"3","1234","python3","box","gemv_r1","1","7","(128, 1, 1)","(256, 1, 1)","0","9.0","10240"
==PROF== Disconnected from process 1234
'''


def test_launches_are_read_in_microseconds_past_the_program_output():
    got = launches(RAW.splitlines())
    assert got == [("gemv_r1", "(256, 1, 1)", 10.24), ("expert_gate_up", "(64, 11, 1)", 20.48),
                   ("gemv_r1", "(64, 1, 1)", 5.12), ("gemv_r1", "(256, 1, 1)", 10.24)]


def test_the_table_ranks_kernels_by_time_a_token():
    t = table(launches(RAW.splitlines()), tokens=2)
    assert [k["kernel"] for k in t["kernels"]] == ["gemv_r1", "expert_gate_up"]
    gemv = t["kernels"][0]
    assert gemv["launches_per_token"] == 1.5 and gemv["us_per_token"] == pytest.approx(12.8)
    assert gemv["grids"] == ["(256, 1, 1)", "(64, 1, 1)"] and gemv["share"] == pytest.approx(25.6 / 46.08)
    assert t["kernel_ms_per_token"] == pytest.approx(0.02304) and t["launches_per_token"] == 2.0


def test_output_without_the_duration_column_is_refused():
    with pytest.raises(ValueError, match="gpu__time_duration.sum"):
        launches(['"ID","Kernel Name","Grid Size"', '"0","gemv_r1","(1, 1, 1)"'])
