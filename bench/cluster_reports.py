"""The stages' per-step reports in `gpipectl local --json` output: for each
step from `first_step` on, once, the K stages' status objects when every one
of them has reported a step time; and the cut the cluster ran. Shared by
cluster_bench.sh's readers."""
import json
import re
import sys


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


def cut(path, k):
    """The layers of each of the k stages in the reports' last complete
    step, in stage order: the balance the cluster ran."""
    steps = step_reports(path, k)
    if not steps:
        return None
    stages = sorted(steps[-1], key=lambda s: int(s.get("stage", 0)))
    return [int(s["layerEnd"]) - int(s.get("layerBegin", 0)) for s in stages]


def plan_bubble(path, k):
    """The workers' mean bubble (%) in `gpipectl plan`'s per-stage table
    (its words: stage or worker/chunk, "[a," "b)", forward, backward,
    update, busy, bubble; a worker's chunks repeat its figure), or None
    when the table does not have k workers."""
    rows = [l.split() for l in open(path)
            if re.match(r"^\s+\d+(/\d+)?\s+\[\d+, \d+\)", l)]
    by_worker = {r[0].split("/")[0]: float(r[7].rstrip("%")) for r in rows}
    if len(by_worker) != k:
        return None
    return sum(by_worker.values()) / k


# gpipectl's schedule names as the spec spells them.
SPEC_SCHEDULES = {"gpipe": "GPIPE", "1f1b": "ONE_F_ONE_B", "zb-h1": "ZERO_BUBBLE_H1",
                  "interleaved": "INTERLEAVED_1F1B", "zb-v": "ZERO_BUBBLE_V"}

if __name__ == "__main__":
    # cluster_reports.py with-cut REPORTS CHUNKS SCHEDULE SPEC OUT: SPEC with
    # the schedule and the cut the cluster ran (CHUNKS stages: K, or K x 2
    # for the interleaved schedule and ZB-V) as its pipeline.balance, so a
    # plan of it simulates that cut and not one of its own from noisy
    # measurements.
    if len(sys.argv) != 7 or sys.argv[1] != "with-cut" or sys.argv[4] not in SPEC_SCHEDULES:
        sys.exit("usage: cluster_reports.py with-cut REPORTS CHUNKS SCHEDULE SPEC OUT")
    balance = cut(sys.argv[2], int(sys.argv[3]))
    if balance is None:
        sys.exit("no per-stage reports in " + sys.argv[2])
    spec = json.load(open(sys.argv[5]))
    pipeline = spec.setdefault("pipeline", {})
    pipeline["schedule"] = SPEC_SCHEDULES[sys.argv[4]]
    if sys.argv[4] in ("interleaved", "zb-v"):
        pipeline["virtualStages"] = 2
    pipeline["balance"] = balance
    json.dump(spec, open(sys.argv[6], "w"))
