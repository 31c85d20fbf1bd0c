#!/usr/bin/env python3
"""One line per Tandem mode of an e2e_train_bench.py JSON (issue 28): how the weights were built and
in how long, the measured tokens/s against the cost model's prediction for that mode (auto: the
split's), the step over the model's lower bound, each resource's busy time in the traced step, and
auto's split counts. Short enough for a device call's output.

    python3 bench/e2e_auto_summary.py result.json

The predictions printed are the ones the run made. To recompute them with the current cost model
(from each mode's cost_model.record, on any machine): tandem_e2e_bench --predict-from result.json.
"""

import json
import sys

PREDICTED_MODE = {"tandem_co": "co", "tandem_resident": "resident", "tandem_offload": "offload",
                  "tandem_offload_int4": "offload", "tandem_offload_resident": "offload-resident",
                  "tandem_auto": "split"}


def line(name, key, r):
    if "error" in r:
        return f"{name} {key}: error {r['error'][-300:]}"
    cost = r.get("cost_model") or {}
    predicted = cost.get("modes", {}).get(PREDICTED_MODE.get(key, ""), {})
    busy = (r.get("busy_trace") or {}).get("busy_ms", {})
    weights = r.get("weights") or {}
    parts = [f"{name} {key}: build {r.get('build_s', 0):.0f} s ({weights.get('source', 'generated')}"
             + (f", write {weights['write_s']:.0f} s" if "write_s" in weights else "") + ")",
             f"{r.get('tokens_per_s', 0):.0f} tok/s"]
    if predicted:
        parts.append(f"predicted {predicted['tokens_per_s']:.0f} ({predicted['tokens_per_s'] / max(r.get('tokens_per_s', 1), 1e-9):.2f}x)")
    if cost.get("step_over_lower_bound"):
        parts.append(f"step/bound {cost['step_over_lower_bound']:.2f}")
    if busy:
        parts.append("busy ms " + " ".join(f"{k} {v:.0f}" for k, v in busy.items()))
    if predicted.get("busy_ms"):
        parts.append("predicted busy ms " + " ".join(f"{k} {v:.0f}" for k, v in predicted["busy_ms"].items()))
    split = r.get("split")
    if split:
        parts.append(f"split pairs resident/streamed/cpu {split['resident_pairs']}/{split['streamed_pairs']}/"
                     f"{split['cpu_pairs']}, streamed experts per call {split['streamed_experts_per_call']:.1f}")
    losses = [s.get("loss") for s in r.get("steps", [])]
    if losses:
        parts.append("losses " + " ".join(f"{x:.4f}" for x in losses if x is not None))
    return "; ".join(parts)


def main():
    results = json.load(open(sys.argv[1]))
    for name, r in results.items():
        for key in PREDICTED_MODE:
            if key in r:
                print(line(name, key, r[key]))
        for k, v in r.items():
            if k.endswith("_tokens_per_s") and isinstance(v, float):
                print(f"{name} {k}: {v:.2f}")
        if r.get("cost_model_check"):
            rates = {k: c["predicted_over_measured"] for k, c in r["cost_model_check"].items()}
            print(f"{name} predicted/measured: " + " ".join(f"{k} {v:.2f}" for k, v in rates.items()))


if __name__ == "__main__":
    main()
