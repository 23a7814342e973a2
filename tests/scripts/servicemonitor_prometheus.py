#!/usr/bin/env python3
"""A Prometheus configuration that does what the Prometheus Operator would
do with the rendered ServiceMonitors and PrometheusRules, for pods that run
without Kubernetes (podman kube play: tests/scripts/pods_e2e_test.sh).

  servicemonitor_prometheus.py RENDERED.yaml --pods PODS.json --out DIR
      [--interval 1s]

PODS.json: [{"name": POD, "labels": {...}}, ...], the pods that run (their
names resolve on the pod network). For every ServiceMonitor endpoint the
Services it selects give the pods (the Service's selector) and the port (the
Service port's targetPort, a container port name). Each target gets the
discovery labels the Operator's kubernetes_sd would give it
(__meta_kubernetes_service_label_*, service, namespace, pod, container,
endpoint port name), then the Operator's own relabelling (job = the Service's
name, namespace, service, pod, container, endpoint), then the endpoint's
`relabelings`, with `honorLabels` as honor_labels. The PrometheusRules'
groups become DIR/rules.yml. Writes DIR/prometheus.yml.
"""

import argparse
import json
import os
import re
import sys

import yaml


def sanitize(name):
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def snake(key):
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_port(pod_spec, port_name):
    for c in pod_spec["containers"]:
        for p in c.get("ports") or []:
            if p.get("name") == port_name or p.get("containerPort") == port_name:
                return c["name"], p["containerPort"]
    return None, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rendered")
    parser.add_argument("--pods", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", default="")
    a = parser.parse_args()
    with open(a.rendered) as f:
        objects = [o for o in yaml.safe_load_all(f) if o]
    with open(a.pods) as f:
        pods = json.load(f)
    services = [o for o in objects if o["kind"] == "Service"]
    templates = [o["spec"]["template"] for o in objects
                 if o["kind"] in ("Deployment", "StatefulSet")]
    scrape_configs = []
    for mon in (o for o in objects if o["kind"] == "ServiceMonitor"):
        namespace = mon["metadata"].get("namespace", "default")
        selector = mon["spec"]["selector"].get("matchLabels", {})
        for index, endpoint in enumerate(mon["spec"]["endpoints"]):
            targets = []
            for svc in services:
                labels = svc["metadata"].get("labels") or {}
                if not selects(selector, labels):
                    continue
                port = next((p for p in svc["spec"]["ports"]
                             if p.get("name") == endpoint["port"]), None)
                if port is None:
                    sys.exit("%s: Service %s has no port %s" %
                             (mon["metadata"]["name"], svc["metadata"]["name"],
                              endpoint["port"]))
                spec = next((t["spec"] for t in templates
                             if selects(svc["spec"]["selector"],
                                        (t.get("metadata") or {}).get("labels") or {})),
                            None)
                if spec is None:
                    sys.exit("Service %s selects no workload" % svc["metadata"]["name"])
                container, number = container_port(spec, port.get("targetPort", port["port"]))
                for pod in pods:
                    if not selects(svc["spec"]["selector"], pod["labels"]):
                        continue
                    meta = {"__meta_kubernetes_service_label_" + sanitize(k): v
                            for k, v in labels.items()}
                    meta.update({
                        "__meta_kubernetes_namespace": namespace,
                        "__meta_kubernetes_service_name": svc["metadata"]["name"],
                        "__meta_kubernetes_pod_name": pod["name"],
                        "__meta_kubernetes_pod_container_name": container,
                        "__meta_kubernetes_endpoint_port_name": endpoint["port"],
                    })
                    targets.append({"targets": ["%s:%d" % (pod["name"], number)],
                                    "labels": meta})
            if not targets:
                sys.exit("ServiceMonitor %s endpoint %d finds no pods" %
                         (mon["metadata"]["name"], index))
            relabel = [
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "target_label": "endpoint"},
            ]
            for r in endpoint.get("relabelings") or []:
                relabel.append({snake(k): v for k, v in r.items()})
            job = {
                "job_name": "serviceMonitor/%s/%s/%d" % (namespace, mon["metadata"]["name"], index),
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                "scrape_interval": a.interval or endpoint.get("interval", "30s"),
                "static_configs": targets,
                "relabel_configs": relabel,
            }
            scrape_configs.append(job)
    groups = []
    for rule in (o for o in objects if o["kind"] == "PrometheusRule"):
        groups += rule["spec"]["groups"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "rules.yml"), "w") as f:
        yaml.safe_dump({"groups": groups}, f, sort_keys=False)
    config = {"global": {"scrape_interval": a.interval or "15s",
                         "evaluation_interval": a.interval or "15s"},
              "rule_files": ["rules.yml"],
              "scrape_configs": scrape_configs}
    with open(os.path.join(a.out, "prometheus.yml"), "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    print("%d scrape jobs, %d targets, %d rule groups" %
          (len(scrape_configs), sum(len(j["static_configs"]) for j in scrape_configs),
           len(groups)))


if __name__ == "__main__":
    main()
