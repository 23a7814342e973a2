#!/usr/bin/env python3
"""Rewrites rendered manifests into what `podman kube play` (4.3) runs.

  kubectl kustomize deploy/k8s/overlays/cpu |
    kube_play_transform.py --secrets SECRETS.yaml --state DIR > play.yaml

The manifests users apply to a cluster stay the source; this changes only
what podman lacks, each change for a stated reason:

  - Kinds podman does not run are dropped: Namespace, Service,
    NetworkPolicy, PodDisruptionBudget, ServiceMonitor, PrometheusRule
    (the e2e gives Prometheus the ServiceMonitors' intent itself).
  - No Services: pods resolve by pod name on the podman network. A
    Deployment of one replica that a Service (not headless) selects becomes
    a Pod named after the Service, so clients dial the name they would dial
    in a cluster (gpipe-controller:7070, which its certificate lists).
  - A Job becomes a Pod of its name (restartPolicy Never).
  - Every other Deployment becomes its replicas as Pods named as podman
    names them (NAME-pod-0, NAME-pod-1, ...), and an emptyDir volume is
    renamed after its pod: podman 4.3 makes an emptyDir a volume named
    after the volume alone (medium Memory too), so one Deployment's
    replicas, and every pod with a `tmp` emptyDir, would share one /tmp,
    where the cluster gives each pod its own and workers share no
    filesystem.
  - No downward API status.podIP: a variable from it takes the pod's name
    (metadata.name, which podman fills and its DNS resolves) instead, and an
    argument --FLAG=$(VAR)[:PORT] using it (podman does not expand $(VAR))
    becomes the image entrypoint's environment flag GPIPE_<BINARY>_<FLAG>
    set to that name (gpipe-worker takes a host alone with its bound port).
  - Secret volumes and secretKeyRef variables (podman 4.3 mounts a Secret's
    values base64-encoded and panics on a volume without `optional`): each
    secret volume becomes a hostPath directory under --state holding the
    decoded files it selects, owned by the pod's runAsUser with the
    volume's defaultMode; a secretKeyRef becomes the decoded value.
  - Container ports are dropped: podman 4.3 publishes each one on the
    host's every address (two workers would then collide on one port);
    pods reach each other on the pod network without it.
  - ConfigMaps no pod reads (the Grafana dashboards) are dropped.

Standard library and PyYAML (Debian's python3-yaml).
"""

import argparse
import base64
import copy
import os
import re
import sys

import yaml

DROPPED_KINDS = {"Namespace", "Service", "NetworkPolicy", "PodDisruptionBudget",
                 "ServiceMonitor", "PrometheusRule"}
VAR_ARG = re.compile(r"^--([a-z0-9_]+)=\$\(([A-Za-z_][A-Za-z0-9_]*)\)(:\d+)?$")


def fail(message):
    sys.exit("kube_play_transform.py: " + message)


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def secret_values(secrets, name):
    if name not in secrets:
        fail("no Secret %r in --secrets (deploy/k8s/make-secrets.sh DIR "
             "--yaml FILE makes them)" % name)
    s = secrets[name]
    values = {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}
    values.update({k: v.encode() for k, v in (s.get("stringData") or {}).items()})
    return values


def rewrite_pod_spec(spec, pod_name, secrets, state):
    user = (spec.get("securityContext") or {}).get("runAsUser", 0)
    group = (spec.get("securityContext") or {}).get("runAsGroup", user)
    renamed = {}
    for volume in spec.get("volumes") or []:
        if "emptyDir" in volume:
            renamed[volume["name"]] = volume["name"] = pod_name + "-" + volume["name"]
        secret = volume.pop("secret", None)
        if secret is None:
            continue
        values = secret_values(secrets, secret["secretName"])
        items = secret.get("items") or [{"key": k, "path": k} for k in sorted(values)]
        mode = secret.get("defaultMode", 0o644)
        directory = os.path.join(state, "secrets", pod_name, volume["name"])
        os.makedirs(directory, exist_ok=True)
        for item in items:
            if item["key"] not in values:
                fail("Secret %r has no key %r" % (secret["secretName"], item["key"]))
            path = os.path.join(directory, item["path"])
            with open(path, "wb") as f:
                f.write(values[item["key"]])
            os.chmod(path, item.get("mode", mode))
            os.chown(path, user, group)
        os.chmod(directory, 0o755)
        volume["hostPath"] = {"path": os.path.abspath(directory), "type": "Directory"}
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        for mount in container.get("volumeMounts") or []:
            mount["name"] = renamed.get(mount["name"], mount["name"])
    for container in spec.get("containers") or []:
        container.pop("ports", None)
        downward = set()
        for env in container.get("env") or []:
            source = env.get("valueFrom") or {}
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                env.pop("valueFrom")
                env["value"] = secret_values(secrets, ref["name"])[ref["key"]].decode().strip()
            elif (source.get("fieldRef") or {}).get("fieldPath") == "status.podIP":
                source["fieldRef"]["fieldPath"] = "metadata.name"
                downward.add(env["name"])
        command = container.get("command") or []
        binary = command[1] if len(command) > 1 and command[0] == "gpipe-entrypoint" else None
        args = []
        for arg in container.get("args") or []:
            m = VAR_ARG.match(arg)
            if m and m.group(2) in downward:
                if binary is None:
                    fail("%s: %s needs the image's entrypoint" % (pod_name, arg))
                prefix = binary.upper().replace("-", "_") + "_"
                container.setdefault("env", []).append({
                    "name": prefix + m.group(1).upper(),
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
                continue
            args.append(arg)
        if "args" in container:
            container["args"] = args


def pod_of(name, template):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name,
                         "labels": (template.get("metadata") or {}).get("labels") or {}},
            "spec": copy.deepcopy(template["spec"])}


def transform(docs, secrets, state, replicas):
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] in replicas:
            doc["spec"]["replicas"] = replicas[doc["metadata"]["name"]]
    services = [d for d in docs if d["kind"] == "Service"]
    read_config_maps = set()
    out = []
    for doc in docs:
        kind = doc["kind"]
        if kind in DROPPED_KINDS or kind == "Secret":
            continue
        if kind == "Deployment":
            template = doc["spec"]["template"]
            labels = (template.get("metadata") or {}).get("labels") or {}
            front = [s for s in services
                     if s["spec"].get("clusterIP") != "None"
                     and selects(s["spec"].get("selector"), labels)]
            if front and doc["spec"].get("replicas", 1) == 1:
                names = [front[0]["metadata"]["name"]]
            else:
                names = ["%s-pod-%d" % (doc["metadata"]["name"], i)
                         for i in range(doc["spec"].get("replicas", 1))]
            for name in names:
                pod = pod_of(name, template)
                rewrite_pod_spec(pod["spec"], name, secrets, state)
                out.append(pod)
            continue
        elif kind == "Job":
            pod = pod_of(doc["metadata"]["name"], doc["spec"]["template"])
            pod["spec"]["restartPolicy"] = "Never"
            rewrite_pod_spec(pod["spec"], pod["metadata"]["name"], secrets, state)
            doc = pod
        elif kind not in ("ConfigMap", "PersistentVolumeClaim", "Pod"):
            fail("kind %s: podman kube play would not run it" % kind)
        out.append(doc)
    for doc in out:
        if doc["kind"] != "Pod":
            continue
        spec = doc["spec"]
        for c in spec.get("containers") or []:
            for e in c.get("envFrom") or []:
                if "configMapRef" in e:
                    read_config_maps.add(e["configMapRef"]["name"])
        for v in spec.get("volumes") or []:
            if "configMap" in v:
                read_config_maps.add(v["configMap"]["name"])
    # ConfigMaps first (podman reads them when it creates the pods), then
    # claims, then the pods in the manifests' order.
    order = {"ConfigMap": 0, "PersistentVolumeClaim": 1}
    out = [d for d in out
           if d["kind"] != "ConfigMap" or d["metadata"]["name"] in read_config_maps]
    return sorted(out, key=lambda d: order.get(d["kind"], 2))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("manifests", nargs="?", default="-",
                        help="rendered manifests (default: standard input)")
    parser.add_argument("--secrets", action="append", default=[],
                        help="Secret manifests (make-secrets.sh --yaml)")
    parser.add_argument("--state", required=True,
                        help="directory for the secret volumes' files")
    parser.add_argument("--replicas", action="append", default=[],
                        metavar="DEPLOYMENT=N", help="scale a Deployment")
    a = parser.parse_args()
    text = sys.stdin.read() if a.manifests == "-" else open(a.manifests).read()
    docs = [d for d in yaml.safe_load_all(text) if d]
    secrets = {}
    for path in a.secrets:
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d and d.get("kind") == "Secret":
                    secrets[d["metadata"]["name"]] = d
    secrets.update({d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"})
    os.makedirs(a.state, exist_ok=True)
    replicas = {}
    for r in a.replicas:
        name, _, n = r.partition("=")
        if not n.isdigit():
            fail("--replicas %s: want DEPLOYMENT=N" % r)
        replicas[name] = int(n)
    yaml.safe_dump_all(transform(docs, secrets, a.state, replicas), sys.stdout,
                       sort_keys=False)


if __name__ == "__main__":
    main()
