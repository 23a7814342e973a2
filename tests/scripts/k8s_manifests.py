#!/usr/bin/env python3
"""Holds rendered Kubernetes manifests against the binaries they run.

  k8s_manifests.py --bin BUILD/bin --dashboards DIR RENDERED.yaml...
      [--probe-services OUT]

Checks, for every container that runs one of our binaries:
  - every argument that is a flag (and every GPIPE_<BINARY>_<FLAG>
    environment variable the entrypoint turns into one) is a flag that the
    binary's --helpfull lists;
  - the container's ports are the ports of its --listen/--metrics_listen/
    --health_listen flags and the other way round; --advertise uses the
    --listen port; probes use the --health_listen port when there is one
    (TLS on the --listen port), else the --listen port;
and across objects: Services select pods and name their container ports,
ServiceMonitor endpoints name ports of the Services they select,
NetworkPolicy ports name container ports of the pods they select, and the
ConfigMap labelled grafana_dashboard holds exactly dashboards/grafana/*.json.
With --probe-services it writes "binary service" lines, one per probe, for
the shell test to ask the running binaries.
With --rules FILE the PrometheusRule's groups must be FILE's (Prometheus's
own rule file, deploy/prometheus/gpipe-rules.yml).
With --sync-dashboards KUSTOMIZATION it rewrites that kustomization's file
list from the dashboards folder instead of checking anything; with
--sync-rules RULES PROMETHEUSRULE it rewrites the PrometheusRule's groups
from the rule file.

Needs PyYAML: the interpreter yamllint runs on has it (Debian python3-yaml).
"""

import argparse
import os
import re
import subprocess
import sys

import yaml

BINARIES = ("gpipe-controller", "gpipe-worker", "gpipectl")
ENV_PREFIX = {
    "gpipe-controller": "GPIPE_CONTROLLER_",
    "gpipe-worker": "GPIPE_WORKER_",
    "gpipectl": "GPIPE_CTL_",
}
# Flags whose value is HOST:PORT that the container serves on, and the
# container port name each must carry.
LISTEN_FLAGS = {"listen": None, "metrics_listen": "metrics",
                "health_listen": "health"}
DASHBOARD_LABEL = "grafana_dashboard"

errors = []


def error(where, message):
    errors.append("%s: %s" % (where, message))


def helpfull_flags(bin_dir, binary):
    path = os.path.join(bin_dir, binary)
    out = subprocess.run([path, "--helpfull"], capture_output=True, text=True,
                         timeout=30)
    text = out.stdout + out.stderr
    flags = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", text, re.MULTILINE))
    if not flags:
        sys.exit("%s --helpfull lists no flags:\n%s" % (path, text[:500]))
    return flags


def load(paths):
    objects = []
    for path in paths:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    objects.append(doc)
    return objects


def name_of(obj):
    meta = obj.get("metadata", {})
    return "%s/%s" % (obj.get("kind"), meta.get("name"))


def pod_specs(objects):
    """(owner, pod template labels, pod spec) of every workload."""
    for obj in objects:
        kind = obj.get("kind")
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            template = obj["spec"]["template"]
            yield (name_of(obj), template.get("metadata", {}).get("labels", {}),
                   template["spec"])


def binary_of(container):
    command = list(container.get("command") or [])
    if command and os.path.basename(command[0]) == "gpipe-entrypoint":
        command = command[1:]
    if not command:
        return None
    binary = os.path.basename(command[0])
    return binary if binary in BINARIES else None


def flag_of(arg):
    """('name', value or None) of a --flag or --flag=value argument."""
    if not arg.startswith("--") or len(arg) == 2:
        return None
    name, eq, value = arg[2:].partition("=")
    return name.replace("-", "_"), (value if eq else None)


def port_of(value):
    m = re.search(r":(\d+)$", value or "")
    return int(m.group(1)) if m else None


def env_flags(container, config_maps, binary):
    """Flags the entrypoint derives from the container's environment."""
    prefix = ENV_PREFIX[binary]
    names = [e["name"] for e in container.get("env", [])]
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref:
            data = config_maps.get(ref["name"])
            if data is None:
                yield None, "envFrom names ConfigMap %s, which is not rendered" % (
                    ref["name"])
                continue
            names.extend(data.keys())
    for name in names:
        for other, other_prefix in ENV_PREFIX.items():
            if other != binary and name.startswith(other_prefix):
                yield None, ("%s is for %s, not %s" % (name, other, binary))
        if name.startswith(prefix):
            yield name[len(prefix):].lower(), name


def check_container(owner, container, flags_by_binary, config_maps, probes):
    binary = binary_of(container)
    where = "%s container %s" % (owner, container.get("name"))
    if binary is None:
        error(where, "command %s runs none of %s" %
              (container.get("command"), ", ".join(BINARIES)))
        return
    known = flags_by_binary[binary]
    values = {}
    for arg in container.get("args", []):
        parsed = flag_of(arg)
        if parsed is None:
            if arg.startswith("-"):
                error(where, "argument %r is not a --flag" % arg)
            continue  # a positional argument (gpipectl's command, a file)
        name, value = parsed
        if name not in known:
            error(where, "%s does not accept --%s (its --helpfull does not "
                  "list it)" % (binary, name))
        values[name] = value
    for name, env in env_flags(container, config_maps, binary):
        if name is None:
            error(where, env)
        elif name not in known:
            error(where, "environment %s would pass --%s, which %s does not "
                  "accept" % (env, name, binary))

    ports = {p["containerPort"]: p.get("name") for p in container.get("ports", [])}
    served = {}
    for flag, port_name in LISTEN_FLAGS.items():
        if values.get(flag) is None:
            continue
        port = port_of(values[flag])
        if port is None or port == 0:
            error(where, "--%s=%s has no fixed port" % (flag, values[flag]))
            continue
        served[port] = flag
        if port not in ports:
            error(where, "--%s listens on %d, which is not a container port" %
                  (flag, port))
        elif port_name and ports[port] != port_name:
            error(where, "port %d of --%s is named %r, expected %r" %
                  (port, flag, ports[port], port_name))
    for port, port_name in ports.items():
        if port not in served:
            error(where, "container port %d (%s) is served by no flag" %
                  (port, port_name))
    listen_port = port_of(values.get("listen"))
    if values.get("advertise") is not None:
        if port_of(values["advertise"]) != listen_port:
            error(where, "--advertise=%s does not use the --listen port %s" %
                  (values["advertise"], listen_port))
    # With TLS on, probes ask the plaintext --health_listen port instead.
    probe_port, probe_flag = listen_port, "--listen"
    if values.get("health_listen") is not None:
        probe_port, probe_flag = port_of(values["health_listen"]), "--health_listen"
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = container.get(kind)
        if probe is None:
            if binary != "gpipectl":
                error(where, "has no %s" % kind)
            continue
        grpc = probe.get("grpc")
        if grpc is None:
            error(where, "%s is not a native gRPC probe" % kind)
            continue
        if grpc.get("port") != probe_port:
            error(where, "%s asks port %s, but health is served on %s port %s"
                  % (kind, grpc.get("port"), probe_flag, probe_port))
        probes.append((binary, kind, grpc.get("service", "")))


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_wiring(objects, pods):
    services = [o for o in objects if o.get("kind") == "Service"]
    for svc in services:
        selector = svc["spec"].get("selector", {})
        matched = [(owner, spec) for owner, labels, spec in pods
                   if selects(selector, labels)]
        if not matched:
            error(name_of(svc), "selects no pods (%s)" % selector)
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            for owner, spec in matched:
                names = {p.get("name") for c in spec["containers"]
                         for p in c.get("ports", [])}
                numbers = {p["containerPort"] for c in spec["containers"]
                           for p in c.get("ports", [])}
                if target not in names and target not in numbers:
                    error(name_of(svc), "targetPort %s is no port of %s" %
                          (target, owner))
    for mon in (o for o in objects if o.get("kind") == "ServiceMonitor"):
        selector = mon["spec"].get("selector", {}).get("matchLabels", {})
        matched = [s for s in services
                   if selects(selector, s["metadata"].get("labels", {}))]
        if not matched:
            error(name_of(mon), "selects no Service (%s)" % selector)
        for endpoint in mon["spec"].get("endpoints", []):
            for svc in matched:
                names = {p.get("name") for p in svc["spec"].get("ports", [])}
                if endpoint.get("port") not in names:
                    error(name_of(mon), "endpoint port %r is not a port of %s "
                          "(%s)" % (endpoint.get("port"), name_of(svc),
                                    sorted(names)))
    for policy in (o for o in objects if o.get("kind") == "NetworkPolicy"):
        selector = policy["spec"].get("podSelector", {}).get("matchLabels", {})
        matched = [spec for _, labels, spec in pods if selects(selector, labels)]
        if not matched:
            error(name_of(policy), "selects no pods (%s)" % selector)
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                for spec in matched:
                    names = {p.get("name") for c in spec["containers"]
                             for p in c.get("ports", [])}
                    if port.get("port") not in names:
                        error(name_of(policy), "port %r is no named port of "
                              "the pods it selects" % port.get("port"))


def dashboard_files(directory):
    return sorted(f for f in os.listdir(directory) if f.endswith(".json"))


def check_dashboards(objects, directory):
    maps = [o for o in objects if o.get("kind") == "ConfigMap" and
            o["metadata"].get("labels", {}).get(DASHBOARD_LABEL)]
    if len(maps) != 1:
        error("dashboards", "expected one ConfigMap labelled %s, found %d" %
              (DASHBOARD_LABEL, len(maps)))
        return
    data = maps[0].get("data") or {}
    files = dashboard_files(directory)
    missing = sorted(set(files) - set(data))
    extra = sorted(set(data) - set(files))
    if missing or extra:
        error(name_of(maps[0]), "differs from %s: missing %s, not there %s; "
              "run tests/scripts/k8s_manifests.py --sync-dashboards "
              "dashboards/grafana/kustomization.yaml" %
              (directory, missing, extra))
    for f in sorted(set(files) & set(data)):
        with open(os.path.join(directory, f)) as fh:
            if fh.read() != data[f]:
                error(name_of(maps[0]), "%s differs from the file" % f)


def sync_dashboards(kustomization):
    directory = os.path.dirname(os.path.abspath(kustomization))
    files = dashboard_files(directory)
    with open(kustomization) as f:
        text = f.read()
    listing = "files:" + ("".join("\n      - %s" % f for f in files)
                          if files else " []")
    new, n = re.subn(r"files:( \[\]|(\n      - \S+)+)", lambda m: listing, text)
    if n != 1:
        sys.exit("%s: no single `files:` list to rewrite" % kustomization)
    with open(kustomization, "w") as f:
        f.write(new)
    print("%s lists %d dashboards" % (kustomization, len(files)))


def check_rules(objects, rules_file):
    with open(rules_file) as f:
        want = yaml.safe_load(f)
    found = [o for o in objects if o.get("kind") == "PrometheusRule"]
    if len(found) != 1:
        error("rules", "expected one PrometheusRule, found %d" % len(found))
        return
    if found[0].get("spec") != want:
        error(name_of(found[0]), "groups differ from %s; run "
              "tests/scripts/k8s_manifests.py --sync-rules %s "
              "deploy/k8s/base/alerts.yaml" % (rules_file, rules_file))


def sync_rules(rules_file, target):
    with open(rules_file) as f:
        groups = yaml.safe_load(f)
    with open(target) as f:
        text = f.read()
    head = text[:text.index("spec:")]
    with open(target, "w") as f:
        f.write(head + yaml.safe_dump({"spec": groups}, sort_keys=False,
                                      width=1000))
    print("%s holds the groups of %s" % (target, rules_file))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin")
    parser.add_argument("--dashboards")
    parser.add_argument("--probe-services")
    parser.add_argument("--sync-dashboards", metavar="KUSTOMIZATION")
    parser.add_argument("--rules")
    parser.add_argument("--sync-rules", nargs=2,
                        metavar=("RULES", "PROMETHEUSRULE"))
    parser.add_argument("rendered", nargs="*")
    args = parser.parse_args()
    if args.sync_dashboards:
        sync_dashboards(args.sync_dashboards)
        return 0
    if args.sync_rules:
        sync_rules(*args.sync_rules)
        return 0
    if not args.bin or not args.dashboards or not args.rendered:
        parser.error("--bin, --dashboards and RENDERED files are required")

    flags_by_binary = {b: helpfull_flags(args.bin, b) for b in BINARIES}
    probes = []
    for path in args.rendered:
        objects = load([path])
        config_maps = {o["metadata"]["name"]: o.get("data") or {}
                       for o in objects if o.get("kind") == "ConfigMap"}
        pods = list(pod_specs(objects))
        for owner, _, spec in pods:
            # A pod whose entrypoint reads GPIPE_CONTROLLER_* or
            # GPIPE_WORKER_* must not get service links of those names.
            runs = {binary_of(c) for c in spec["containers"]}
            if runs & {"gpipe-controller", "gpipe-worker"} and \
                    spec.get("enableServiceLinks", True) is not False:
                errors.append("%s: %s: enableServiceLinks is not false" %
                              (os.path.basename(path), owner))
            for container in spec.get("initContainers", []) + spec["containers"]:
                before = len(errors)
                check_container(owner, container, flags_by_binary, config_maps,
                                probes)
                for i in range(before, len(errors)):
                    errors[i] = "%s: %s" % (os.path.basename(path), errors[i])
        before = len(errors)
        check_wiring(objects, pods)
        if any(o.get("kind") == "Deployment" for o in objects):
            check_dashboards(objects, args.dashboards)
            if args.rules:
                check_rules(objects, args.rules)
        for i in range(before, len(errors)):
            errors[i] = "%s: %s" % (os.path.basename(path), errors[i])
    if args.probe_services:
        with open(args.probe_services, "w") as f:
            for binary, kind, service in sorted(set(probes)):
                f.write("%s %s %s\n" % (binary, kind, service or '""'))
    for e in errors:
        print("FAIL: %s" % e)
    print("%d manifests files checked, %d problems" %
          (len(args.rendered), len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
