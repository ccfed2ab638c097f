# Run a script or pytest with runner.attention_cuda.KV_CHUNK set: withchunk.py CHUNK (pytest ARGS | SCRIPT ARGS)
import runpy, sys
import runner.attention_cuda as a
a.KV_CHUNK = int(sys.argv[1])
if sys.argv[2] == "pytest":
    import pytest
    sys.exit(pytest.main(sys.argv[3:]))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
