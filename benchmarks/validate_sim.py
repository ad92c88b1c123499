"""The simulator against Meta's ETTR model and Llama 3's 54 days, as a table. Prints JSON.

The scenarios and sources are in ``hotswap.sim.validation``; ``tests/test_sim_validation.py``
asserts the same agreement (within 1 point of the expected ETTR, 419 +- 3 sd interruptions,
above 90% with hotswap) in CI.

    python benchmarks/validate_sim.py [--seeds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

from hotswap.sim import validation
from hotswap.sim.runner import simulate, summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    meta = []
    for policy in ("hotswap", "wait-for-repair"):
        for nodes in validation.ETTR_SIZES:
            config = validation.job_alone(nodes, policy)
            runs = [summarize(simulate(validation.with_seed(config, s), policy), 0.0) for s in range(args.seeds)]
            simulated = statistics.fmean(r.main_goodput for r in runs)
            expected = validation.expected_ettr(config, policy)
            meta.append({
                "policy": policy, "nodes": nodes, "u0_s": validation.restart_overhead(config, policy),
                "checkpoint_s": config.checkpoint_interval_s, "expected_ettr": round(expected, 4),
                "simulated_goodput": round(simulated, 4), "difference": round(simulated - expected, 4),
            })
            if not args.json:
                print(f"{policy:16s} {nodes:>6} nodes: Meta E[ETTR] {expected:.4f}, simulated {simulated:.4f}")
    config = validation.llama3()
    llama = {}
    for policy in config.policies:
        run = summarize(simulate(config, policy), 0.0)
        llama[policy] = {"goodput": round(run.main_goodput, 4), "interruptions": run.counts.disruptions}
        if not args.json:
            print(f"Llama 3, {policy:16s}: goodput {run.main_goodput:.4f}, {run.counts.disruptions} interruptions")
    print(json.dumps({"meta_ettr": meta, "llama3": llama}))


if __name__ == "__main__":
    main()
