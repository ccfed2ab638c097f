"""Wrap `runner profile`: run the prompt 3 times in one process (the 2nd and 3rd with other random token ids,
so nothing is reused), record each TTFT and phase figures, and cProfile the first request."""
import cProfile, io, json, pstats, sys, time
import os
sys.path.insert(0, os.getcwd())
import numpy as np
import runner.cli.profile as prof

OUT = sys.argv.pop(1)
orig = prof.profile_run
LOG = []


def probe(engine, tokens, n_gen, draft):
    first = None
    rng = np.random.default_rng(1)
    for i in range(3):
        toks = tokens if i == 0 else [tokens[0]] + [int(t) for t in rng.integers(100, 5000, len(tokens) - 1)]
        pr = cProfile.Profile() if i < 2 else None
        if pr: pr.enable()
        t0 = time.perf_counter()
        run = orig(engine, toks, n_gen, draft)
        wall = time.perf_counter() - t0
        if pr:
            pr.disable()
            s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
            s2 = io.StringIO(); pstats.Stats(pr, stream=s2).sort_stats("tottime").print_stats(30)
            open(OUT + f".prof{i}.txt", "w").write(s.getvalue() + "\n\n" + s2.getvalue())
        ph = run.at_first.get("phase", {}).get("last") if isinstance(run.at_first.get("phase"), dict) else None
        LOG.append({"i": i, "ttft_s": run.ttft_s, "wall_s": wall, "new_tokens": run.new_tokens,
                    "decode_s": run.decode_s, "phase_last": ph})
        print("PROBE", json.dumps(LOG[-1], default=str), flush=True)
        first = first or run
    json.dump(LOG, open(OUT, "w"), default=str, indent=1)
    return first


prof.profile_run = probe
from runner.cli.main import main
sys.argv[0] = "runner"
main()
