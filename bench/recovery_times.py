#!/usr/bin/env python3
"""Reads recovery_bench.sh's record: the job's WatchJob events (one JSON
JobEvent a line, from `gpipectl watch --json`) and the kill times (epoch
seconds and victim, a line each); prints each kill's recovery timeline and
the median and max of every column.
  recovery_times.py EVENTS.jsonl KILLS.txt"""
import json
import statistics
import sys
from datetime import datetime, timezone

GOAL_S = 2.0


def parse_time(text):
    # RFC 3339 with 0-9 fractional digits and 'Z' (protobuf's JSON Timestamp).
    base, _, frac = text.rstrip("Z").partition(".")
    t = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return t.timestamp() + (float("0." + frac) if frac else 0.0)


def read_events(path):
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            e = json.loads(line)
            s = e.get("job", {}).get("status", {})
            events.append({
                "t": parse_time(e["time"]),
                "state": s.get("state", ""),
                "step": int(s.get("step", 0)),
                "epoch": int(s.get("epoch", 0)),
                "message": e.get("message", ""),
            })
    events.sort(key=lambda e: e["t"])
    return events


def step_time(events, epoch, before):
    """Seconds per step over the epoch's RUNNING events before `before`: the
    span over the steps it covers, so checkpoint writes count as they do in a
    replay (the first 5 steps of the epoch left out: the pipeline fills).
    Not a median of event gaps: the controller often publishes a few steps
    at once."""
    run = [e for e in events if e["epoch"] == epoch and e["state"] == "RUNNING"
           and e["t"] < before]
    if not run:
        return None
    first = run[0]["step"] + 5
    run = [e for e in run if e["step"] >= first]
    if len(run) < 2 or run[-1]["step"] <= run[0]["step"]:
        return None
    return (run[-1]["t"] - run[0]["t"]) / (run[-1]["step"] - run[0]["step"])


def analyse(events, kill_t):
    before = [e for e in events if e["t"] <= kill_t]
    after = [e for e in events if e["t"] > kill_t]
    if not before or not after:
        return None
    e0 = before[-1]["epoch"]
    reached = max(e["step"] for e in before if e["epoch"] == e0)
    noticed = next((e for e in after
                    if e["epoch"] > e0 or e["state"] not in ("RUNNING",)), None)
    running = next((e for e in after
                    if e["epoch"] > e0 and e["state"] == "RUNNING"), None)
    if noticed is None or running is None:
        return None
    e1 = running["epoch"]
    restored = running["step"]
    first = next((e for e in after if e["epoch"] == e1 and e["t"] >= running["t"]
                  and e["step"] > restored), None)
    caught = next((e for e in after if e["epoch"] == e1 and e["step"] > reached),
                  None)
    per_step = step_time(events, e0, kill_t)
    r = {
        "reached": reached,
        "restored": restored,
        "replayed": reached - restored,
        "noticed": noticed["t"] - kill_t,
        "noticed_how": noticed["message"] or noticed["state"],
        "running": running["t"] - kill_t,
        "first": first["t"] - kill_t if first else None,
        "caught": caught["t"] - kill_t if caught else None,
        "step_ms": per_step * 1000 if per_step else None,
    }
    if r["caught"] is not None and per_step:
        # What recovery itself cost: the time to catch up less the steps
        # that had to be computed again (and the one in flight at the kill).
        r["overhead"] = r["caught"] - (r["replayed"] + 1) * per_step
    else:
        r["overhead"] = None
    return r


def fmt(v, unit="s"):
    if v is None:
        return "-"
    return "%.3f" % v if unit == "s" else "%.2f" % v


def main():
    events = read_events(sys.argv[1])
    kills = []
    with open(sys.argv[2]) as f:
        for line in f:
            t, victim = line.split()
            kills.append((float(t), victim))
    rows = []
    print("%-4s %-6s %7s %7s %7s %9s %8s %9s %9s %9s %10s" % (
        "kill", "victim", "reached", "replay", "noticed", "running",
        "1st step", "caught up", "step ms", "overhead", "goal<2s"))
    for i, (t, victim) in enumerate(kills, 1):
        r = analyse(events, t)
        if r is None:
            print("%-4d %-6s (no recovery in the events)" % (i, victim))
            continue
        rows.append(r)
        ok = "-" if r["overhead"] is None else (
            "yes" if r["overhead"] < GOAL_S else "NO")
        print("%-4d %-6s %7d %7d %7s %9s %8s %9s %9s %9s %10s" % (
            i, victim, r["reached"], r["replayed"], fmt(r["noticed"]),
            fmt(r["running"]), fmt(r["first"]), fmt(r["caught"]),
            fmt(r["step_ms"], "ms"), fmt(r["overhead"]), ok))
    if not rows:
        sys.exit("no kill was followed by a recovery in the events")
    print("seconds from the kill; overhead = caught up - (replayed + 1) x step time")
    for key, name in (("noticed", "noticed"), ("running", "running again"),
                      ("first", "first step after"), ("caught", "caught up"),
                      ("overhead", "overhead"), ("replayed", "steps replayed"),
                      ("step_ms", "ms per step")):
        vals = [r[key] for r in rows if r[key] is not None]
        if vals:
            print("%-17s median %8.3f  max %8.3f" % (
                name + ":", statistics.median(vals), max(vals)))
    print("how noticed: " + "; ".join(sorted({r["noticed_how"] for r in rows})))


if __name__ == "__main__":
    main()
