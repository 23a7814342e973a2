#!/usr/bin/env python3
"""Checks a gpipe trace as an outside reader would: the Chrome trace JSON
parses, has one named track per stage (per replica and stage with
--replicas R: tracks replica by replica, each running M/R micro-batches),
the expected slices per stage and step (M forwards, M backwards, M recomputes on stages that re-materialize,
one optimizer step; with --split-backward M input and M weight halves
instead of whole backwards), op slices that do not overlap within a track and lie
inside their step; the SVG is well-formed XML with a row per stage and as
many op boxes as the JSON has op slices.

  check_trace.py TRACE.json TIMELINE.svg --stages K --micro-batches M
      [--replicas R] [--steps N] [--remat always|except_last|never]
      [--split-backward]
Prints one line per check that failed and exits 1, or "trace ok ..." and 0.
"""
import argparse
import collections
import json
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
PHASES = ("forward", "backward", "recompute", "optimizer", "backward_input",
          "backward_weight")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json_path")
    ap.add_argument("svg_path")
    ap.add_argument("--stages", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="steps per stage (0: any)")
    ap.add_argument("--remat", default="except_last")
    ap.add_argument("--split-backward", action="store_true",
                    help="a zero-bubble schedule: backward_input and "
                    "backward_weight slices instead of backward")
    a = ap.parse_args()
    errors = []

    with open(a.json_path, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
    tracks = a.stages * a.replicas
    if sorted(names) != list(range(tracks)):
        errors.append(f"tracks {sorted(names)}, want 0..{tracks - 1}")

    def track_name(tid):
        replica, stage = divmod(tid, a.stages)
        if a.replicas > 1:
            return f"replica {replica} stage {stage}"
        return f"stage {stage}"

    for tid, name in names.items():
        if name != track_name(tid):
            errors.append(f"track {tid} is named {name!r}, want {track_name(tid)!r}")

    steps = collections.defaultdict(dict)  # tid -> step -> (ts, end)
    ops = collections.defaultdict(list)  # tid -> [(ts, end, cat, step)]
    for e in events:
        if e.get("ph") != "X":
            continue
        if e["dur"] < 0:
            errors.append(f"negative duration: {e}")
        end = e["ts"] + e["dur"]
        if e["cat"] == "step":
            steps[e["tid"]][e["args"]["step"]] = (e["ts"], end)
        elif e["cat"] in PHASES:
            ops[e["tid"]].append((e["ts"], end, e["cat"], e["args"]["step"]))
        else:
            errors.append(f"unknown category {e['cat']!r}")

    m = a.micro_batches // a.replicas
    op_slices = 0
    for track in range(tracks):
        stage = track % a.stages
        remat = a.remat == "always" or (a.remat == "except_last" and stage < a.stages - 1)
        split = a.split_backward
        want = {"forward": m, "backward": 0 if split else m,
                "recompute": m if remat else 0, "optimizer": 1,
                "backward_input": m if split else 0,
                "backward_weight": m if split else 0}
        if a.steps and len(steps[track]) != a.steps:
            errors.append(f"{track_name(track)}: {len(steps[track])} steps, want {a.steps}")
        per_step = collections.defaultdict(collections.Counter)
        for ts, end, cat, step in ops[track]:
            per_step[step][cat] += 1
            if step not in steps[track]:
                errors.append(f"{track_name(track)}: an op of step {step}, which has no step slice")
                continue
            s0, s1 = steps[track][step]
            # Times are printed to the nanosecond: allow rounding.
            if ts < s0 - 0.002 or end > s1 + 0.002:
                errors.append(f"{track_name(track)}: a {cat} op of step {step} lies outside its step")
        for step in steps[track]:
            got = {p: per_step[step][p] for p in PHASES}
            if got != want:
                errors.append(f"{track_name(track)} step {step}: slices {got}, want {want}")
        spans = sorted((ts, end) for ts, end, _, _ in ops[track])
        for (_, end0), (ts1, _) in zip(spans, spans[1:]):
            if ts1 < end0 - 0.002:
                errors.append(f"{track_name(track)}: ops overlap ({ts1} < {end0})")
                break
        op_slices += len(ops[track])

    root = ET.parse(a.svg_path).getroot()  # raises on malformed XML
    if root.tag != SVG + "svg":
        errors.append(f"SVG root is {root.tag}")
    groups = [g for g in root.iter(SVG + "g") if g.get("class") == "stage"]
    if len(groups) != tracks:
        errors.append(f"SVG has {len(groups)} stage rows, want {tracks}")
    boxes = [r for r in root.iter(SVG + "rect") if r.get("class") in PHASES]
    if len(boxes) != op_slices:
        errors.append(f"SVG has {len(boxes)} op boxes, JSON {op_slices} op slices")
    texts = " ".join(t.text or "" for t in root.iter(SVG + "text"))
    for word in ("forward", "backward", "optimizer", "idle (bubble)", "time (ms)"):
        if word not in texts:
            errors.append(f"SVG legend or axis lacks {word!r}")

    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"trace ok: {tracks} tracks, {op_slices} op slices, "
          f"{sum(len(s) for s in steps.values())} stage-steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
