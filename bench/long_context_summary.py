"""Issue 29: one line per sequence length of an e2e bench JSON (bench/e2e_train_bench.py --out, or
tandem_e2e_bench's own): tokens/s, the losses, the GPU allocator's peak against the planner's
prediction (their ratio: the issue asks it within 15 %), and the host's memory per phase
(host_rss: after the build, the length's first forward and first step).

    python3 bench/long_context_summary.py RESULT.json
"""

import json
import sys

GIB = float(1 << 30)


def runs(node):
    """Every tandem_e2e_bench result in the file (a dict with "tokens" and "steps" or "error")."""
    if isinstance(node, dict):
        if "tokens" in node and ("steps" in node or "error" in node):
            yield node
            for more in node.get("more_tokens", []):
                yield more
            return
        for value in node.values():
            yield from runs(value)
    elif isinstance(node, list):
        for value in node:
            yield from runs(value)


def rss_text(rss):
    parts = []
    for phase in ("after_build", "after_first_forward", "after_first_step"):
        p = rss.get(phase)
        if p:
            parts.append(f"{phase} {p.get('VmRSS_bytes', 0) / GIB:.1f} GiB "
                         f"(anon {p.get('RssAnon_bytes', 0) / GIB:.1f}, peak {p.get('VmHWM_bytes', 0) / GIB:.1f})")
    return "; ".join(parts)


def main(path):
    with open(path) as f:
        data = json.load(f)
    for r in runs(data):
        tokens = r["tokens"]
        if "error" in r:
            print(f"{tokens:>7} tokens: ERROR {str(r['error'])[-300:]}")
            continue
        seq = r.get("sequence", {})
        losses = [round(s.get("loss", float("nan")), 3) for s in r.get("steps", [])]
        alloc = seq.get("peak_allocated_bytes", 0) / GIB
        pred = seq.get("predicted_allocator_bytes", 0) / GIB
        ratio = seq.get("predicted_over_allocated", 0)
        # predicted_reserved_bytes (the allocated figure plus the allocator's cache margin) and
        # expandable_segments exist from branch lc4 on.
        reserved = ""
        if "predicted_reserved_bytes" in seq:
            reserved = (f"; reserved predicted {seq['predicted_reserved_bytes'] / GIB:.2f} GiB, "
                        f"predicted/reserved {seq.get('predicted_over_reserved', 0):.2f}, "
                        f"expandable segments {'on' if seq.get('expandable_segments') else 'off'}")
        print(f"{tokens:>7} tokens: {r.get('tokens_per_s', seq.get('tokens_per_s', 0)):,.0f} tok/s, losses {losses}, "
              f"GPU peak allocated {alloc:.2f} GiB (reserved {seq.get('peak_reserved_bytes', 0) / GIB:.2f}), "
              f"predicted {pred:.2f} GiB, predicted/allocated {ratio:.2f}{reserved}")
        if r.get("host_rss"):
            print(f"{'':>16}host: {rss_text(r['host_rss'])}")


if __name__ == "__main__":
    main(sys.argv[1])
