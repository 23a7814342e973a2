"""The stages' per-step reports in `gpipectl local --json` output: for each
step from `first_step` on, once, the K stages' status objects when every one
of them has reported a step time. Shared by cluster_bench.sh's readers."""
import json


def step_reports(path, k, first_step=3):
    seen, steps = set(), []
    for line in open(path):
        try:
            status = json.loads(line)["job"]["status"]
        except (ValueError, KeyError):
            continue
        stages = status.get("stages", [])
        step = int(status.get("step", 0))
        if step < first_step or step in seen or len(stages) != k:
            continue
        if any(s.get("stepSeconds", 0) <= 0 for s in stages):
            continue
        seen.add(step)
        steps.append(stages)
    return steps
