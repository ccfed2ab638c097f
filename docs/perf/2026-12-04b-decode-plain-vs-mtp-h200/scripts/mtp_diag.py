"""Wrap `runner profile` and log every DepthPolicy.observe call (drafted, accepted, draft_s, verify_s, depth after)."""
import json, os, sys, time
import runner.spec.depth as depth_mod

LOG = []
_orig = depth_mod.DepthPolicy.observe


def observe(self, drafted, accepted, draft_s, verify_s):
    _orig(self, drafted, accepted, draft_s, verify_s)
    LOG.append({"t": time.perf_counter(), "drafted": drafted, "accepted": accepted, "draft_s": draft_s,
                "verify_s": verify_s, "depth_after": self.depth, "a": list(self.accept),
                "cd": self.draft_step_s, "cv": dict(self.verify_s)})


depth_mod.DepthPolicy.observe = observe
out = sys.argv.pop(1)
import atexit
atexit.register(lambda: open(out, "w").write(json.dumps(LOG)))
from runner.cli.main import main
sys.argv[0] = "runner"
main()
