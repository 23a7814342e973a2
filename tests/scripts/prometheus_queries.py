#!/usr/bin/env python3
"""Evaluates every PromQL expression of the Grafana dashboards and of the
alert rules against a live Prometheus through its HTTP API.

  prometheus_queries.py URL DASHBOARD_DIR [--deadline SECONDS]

Dashboard panel targets, template variable queries and the quantities the
annotations compare must return data (the
template variables are substituted: $job with a training job Prometheus has
seen, $stage and $replica with every one). Alert rules must be loaded, healthy and
evaluated, their expressions must run, and the quantity each thresholds (its
`signal` annotation) must return data. Retries until all pass or the deadline
(rates need a few scrapes); prints what failed and exits 1 otherwise.
"""
import glob
import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request

RATE_INTERVAL = "10s"  # four scrapes at the test's 1 s interval


def get(url, path, **params):
    q = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{q}", timeout=5) as r:
        return json.load(r)


def query(url, expr):
    """(ok, number of series or samples, error text)."""
    try:
        body = get(url, "/api/v1/query", query=expr)
    except Exception as e:  # HTTP 400 carries the PromQL error
        detail = getattr(e, "read", lambda: b"")().decode(errors="replace")
        return False, 0, f"{e} {detail}".strip()
    if body.get("status") != "success":
        return False, 0, body.get("error", "query failed")
    data = body["data"]
    n = len(data["result"]) if data["resultType"] in ("vector", "matrix") else 1
    return True, n, ""


def training_job(url):
    body = get(url, "/api/v1/query", query="gpipe_job_step")
    for r in body["data"]["result"]:
        return r["metric"].get("job")
    return None


def substitute(expr, job):
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    expr = expr.replace("$__interval", "5s")
    # Job ids are [a-z0-9-]: no regex metacharacters to escape.
    expr = expr.replace("$job", job)
    expr = expr.replace("$stage", ".*")
    expr = expr.replace("$replica", ".*")
    return expr


def variable_expr(query_text):
    """label_values(EXPR, LABEL) -> an expression whose series carry LABEL."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query_text)
    if not m:
        return query_text
    return f"count by ({m.group(2)}) ({m.group(1)})"


def dashboard_exprs(directory):
    exprs = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        name = os.path.basename(path)
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") == "query":
                q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                exprs.append((f"{name} variable {v['name']}", variable_expr(q)))
        for p in d.get("panels", []):
            targets = p.get("targets", [])
            if not targets:
                exprs.append((f"{name} panel '{p['title']}'", None))
            for t in targets:
                exprs.append((f"{name} panel '{p['title']}' {t['refId']}", t["expr"]))
        # An annotation marks moments (a comparison that is empty most of
        # the time): the quantity it compares must return data.
        for a in d.get("annotations", {}).get("list", []):
            if "expr" in a:
                quantity = re.split(r"\s+(?:>|<|==|!=|>=|<=)\s+", a["expr"])[0]
                exprs.append((f"{name} annotation '{a['name']}'", quantity))
    return exprs


def check(url, directory, job):
    failures, counted = [], 0
    for where, expr in dashboard_exprs(directory):
        if expr is None:
            failures.append(f"{where}: no query")
            continue
        e = substitute(expr, job)
        ok, n, err = query(url, e)
        counted += 1
        if not ok:
            failures.append(f"{where}: {e}: error {err}")
        elif n == 0:
            failures.append(f"{where}: {e}: no data")
    rules = [r for g in get(url, "/api/v1/rules")["data"]["groups"] for r in g["rules"]]
    if len(rules) < 5:
        failures.append(f"only {len(rules)} rules loaded")
    for r in rules:
        where = f"rule {r['name']}"
        counted += 1
        if r.get("health") != "ok":
            failures.append(f"{where}: health {r.get('health')} {r.get('lastError', '')}")
        if r.get("lastEvaluation", "").startswith("0001"):
            failures.append(f"{where}: not evaluated yet")
        ok, _, err = query(url, r["query"])
        if not ok:
            failures.append(f"{where}: {r['query']}: error {err}")
        signal = r.get("annotations", {}).get("signal")
        if not signal:
            failures.append(f"{where}: no signal annotation")
            continue
        ok, n, err = query(url, signal)
        if not ok or n == 0:
            failures.append(f"{where}: signal {signal}: {err or 'no data'}")
    return failures, counted


def main():
    url, directory = sys.argv[1].rstrip("/"), sys.argv[2]
    deadline = time.time() + (float(sys.argv[4]) if len(sys.argv) > 4 else 40)
    failures = ["no training job seen"]
    while time.time() < deadline:
        job = training_job(url)
        if job:
            failures, counted = check(url, directory, job)
            if not failures:
                print(f"all {counted} dashboard and rule expressions returned "
                      f"data for job {job}")
                return 0
        time.sleep(1)
    print("FAIL: expressions without data or with errors:", file=sys.stderr)
    for f in failures:
        print("  " + f, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
