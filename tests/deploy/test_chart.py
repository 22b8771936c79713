"""helm/txsync rendered, linted and validated with Helm's own engine, and every object
checked against the Kubernetes schemas of two minor versions."""

from __future__ import annotations

import ast
import hashlib
import re
import tomllib
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.support.chart import CHART, EXAMPLES, ROOT, example_values, merged, notes, render
from tests.support.monitoring import (
    alert_rules,
    dashboard,
    expressions,
    metric_names,
    monitoring_objects,
)
from txsync.command_lines import (
    coordinator_args,
    dispatch_args,
    flags,
    store_args,
    worker_args,
)

KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
EXAMPLE_RELEASES = [
    ("three-dcs", "dc1.yaml"), ("three-dcs", "dc2.yaml"), ("three-dcs", "dc3.yaml"),
    ("two-dcs-witness", "dc1.yaml"), ("two-dcs-witness", "dc2.yaml"),
    ("two-dcs-witness", "witness.yaml"),
    ("one-cluster-per-dc", "dc1.yaml"), ("one-cluster-per-dc", "dc2.yaml"),
    ("one-cluster-per-dc", "dc3.yaml"),
]  # fmt: skip
COMPONENT = "app.kubernetes.io/component"
NOT_IN_KUBERNETES = {"ServiceMonitor", "PrometheusRule"}
"""Custom resources (Prometheus operator): no schema in kubernetes-validate."""


def _every_option_on(values: dict[str, Any]) -> dict[str, Any]:
    return merged(
        values,
        {
            "networkPolicy": {"enabled": True, "peerCIDRs": ["10.2.0.0/16"]},
            "serviceMonitor": {"enabled": True},
            "dashboards": {"enabled": True},
            "access": {"secretName": "txsync-access"},
        },
    )


@pytest.mark.parametrize(("example", "dc_file"), EXAMPLE_RELEASES)
def test_every_example_renders_lints_and_validates(example: str, dc_file: str) -> None:
    values = _every_option_on(example_values(example, dc_file))
    release = f"txsync-{values['dc']}"
    helm_python.Chart.load(CHART).validate_schema(values)
    report = helm_python.lint(CHART, values, strict=True, namespace=release)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems
    objects = render(values, release, release)
    kinds = sorted(o["kind"] for o in objects)
    witness = values["dc"] == "witness"
    assert kinds.count("StatefulSet") == (1 if witness else 2), kinds
    assert kinds.count("PrometheusRule") == 1 and kinds.count("ServiceMonitor") == 1, kinds
    for version in KUBERNETES_VERSIONS:
        for manifest in objects:
            if manifest["kind"] in NOT_IN_KUBERNETES:
                continue
            kubernetes_validate.validate(manifest, version, strict=True)


def test_the_dashboard_and_alerts_parse_and_each_alert_has_its_runbook() -> None:
    """Whether the services export what they query: the dev cluster's end-to-end test,
    against real processes."""
    objects = monitoring_objects()
    for name, expr in expressions(objects).items():
        try:
            assert metric_names(expr), f"{name} queries no metric"
        except ValueError as error:
            raise AssertionError(f"{name}: {expr!r} does not parse: {error}") from None
    rows = [p["title"] for p in dashboard(objects)["panels"] if p["type"] == "row"]
    assert rows == ["Agreement", "Store", "Workers", "WAN", "Resources"]
    headings = {
        re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in (ROOT / "docs" / "operations.md").read_text().splitlines()
        if line.startswith("#")
    }
    for rule in alert_rules(objects):
        anchor = rule["annotations"]["runbook_url"].rpartition("#")[2]
        assert anchor in headings, f"{rule['alert']}: no section #{anchor} in docs/operations.md"
        assert rule["labels"]["severity"] in {"warning", "critical"} and rule["labels"]["dc"]


def test_without_service_monitors_no_alerts_and_no_dashboard_by_default() -> None:
    values = example_values("three-dcs", "dc1.yaml")
    kinds = {o["kind"] for o in render(values, "txsync-dc1", "txsync")}
    assert not kinds & {"PrometheusRule", "ServiceMonitor"}
    assert not any(
        o["metadata"]["name"].endswith("-dashboard") for o in render(values, "txsync-dc1", "txsync")
    )


@pytest.mark.parametrize(("example", "dc_file"), EXAMPLE_RELEASES)
def test_every_example_release_names_the_one_access_secret_of_the_guide(
    example: str, dc_file: str
) -> None:
    """Per-release tokens would make every other DC refuse the caller: each example's
    releases name the secret `txsync access secret` makes (k8s/README.md), and render
    none of their own."""
    values = example_values(example, dc_file)
    objects = render(values, f"txsync-{values['dc']}", "txsync")
    assert not [o for o in objects if o["kind"] == "Secret"]
    sets = [o for o in objects if o["kind"] == "StatefulSet"]
    for container in (c for s in sets for c in s["spec"]["template"]["spec"]["containers"]):
        token = next(e for e in container["env"] if e["name"] == "TXSYNC_SERVICE_TOKEN")
        assert token["valueFrom"]["secretKeyRef"]["name"] == "txsync-access", container["name"]


@pytest.mark.parametrize(("example", "dc_file"), EXAMPLE_RELEASES)
def test_every_service_port_reaches_a_port_of_every_pod_it_selects(
    example: str, dc_file: str
) -> None:
    """A Service's port whose pods lack it makes targets that are always down (the one
    metrics Service selected every pod for every metrics port: 3 of 4 targets down)."""
    values = _every_option_on(example_values(example, dc_file))
    objects = render(values, f"txsync-{values['dc']}", f"txsync-{values['dc']}")
    pods = [
        (o["spec"]["template"]["metadata"]["labels"], o["spec"]["template"]["spec"]["containers"])
        for o in objects
        if o["kind"] == "StatefulSet"
    ]
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        selected = [c for labels, c in pods if selector.items() <= labels.items()]
        assert selected, f"{service['metadata']['name']} selects no pod"
        for containers in selected:
            ports = {p.get("name") for c in containers for p in c["ports"]}
            ports |= {p["containerPort"] for c in containers for p in c["ports"]}
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                assert target in ports, (service["metadata"]["name"], port, sorted(map(str, ports)))
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    scraped = {e["port"] for e in monitor["spec"]["endpoints"]}
    named = {
        p["name"]
        for o in objects
        if o["kind"] == "Service" and o["metadata"]["labels"].get(COMPONENT) == "metrics"
        for p in o["spec"]["ports"]
    }
    assert named <= scraped, "every metrics port is scraped"


def test_a_dc_in_a_cluster_of_its_own_exposes_its_ports_to_the_other_dcs() -> None:
    """One Kubernetes cluster per DC (k8s/one-cluster-per-dc): the peer and client ports
    behind LoadBalancers at the names the other DCs dial, admitted from their CIDRs;
    the coordinators dial each other's external addresses."""
    values = example_values("one-cluster-per-dc", "dc2.yaml")
    objects = render(values, "txsync-dc2", "txsync-dc2")
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    peer, client = services["txsync-dc2-peer"], services["txsync-dc2"]
    for service, port in ((peer, "peer"), (client, "client")):
        assert service["spec"]["type"] == "LoadBalancer"
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port]
        hostname = service["metadata"]["annotations"]["external-dns.alpha.kubernetes.io/hostname"]
        assert hostname == "dc2.txsync.example.net"
    master = next(o for o in objects if o["metadata"]["name"] == "txsync-dc2-master"
                  and o["kind"] == "StatefulSet")  # fmt: skip
    containers = {c["name"]: c["args"] for c in master["spec"]["template"]["spec"]["containers"]}
    assert "--peer=dc1=dc1.txsync.example.net:7002" in containers["sync-coordinator"]
    assert "--peer-store=dc3=dc3.txsync.example.net:7001" in containers["transaction-store"]
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy"
                  and o["metadata"]["name"] == "txsync-dc2-master")  # fmt: skip
    admitted = {
        port["port"]: [f["ipBlock"]["cidr"] for f in rule["from"] if "ipBlock" in f]
        for rule in policy["spec"]["ingress"]
        for port in rule["ports"]
    }
    assert admitted[7001] == admitted[7002] == values["networkPolicy"]["peerCIDRs"]
    one_cluster = render(example_values("three-dcs", "dc2.yaml"), "txsync-dc2", "txsync-dc2")
    assert not [o for o in one_cluster if o["metadata"]["name"] == "txsync-dc2-peer"]


def test_the_master_pod_runs_three_services_wired_to_the_whole_cluster() -> None:
    values = example_values("three-dcs", "dc2.yaml")
    objects = render(values, "txsync-dc2", "txsync-dc2")
    master = next(o for o in objects if o["metadata"]["name"] == "txsync-dc2-master"
                  and o["kind"] == "StatefulSet")  # fmt: skip
    containers = {c["name"]: c for c in master["spec"]["template"]["spec"]["containers"]}
    assert sorted(containers) == ["sync-coordinator", "transaction-store", "worker-dispatch"]
    coordinator = containers["sync-coordinator"]["args"]
    assert "--peer=dc1=txsync-dc1-master-0.txsync-dc1-master.txsync-dc1.svc.cluster.local:7002" in (
        coordinator
    )
    assert "--tls-ca=/etc/txsync/tls/ca.crt" in coordinator and "--plaintext" not in coordinator
    store = containers["transaction-store"]["args"]
    assert "--peer-store=dc3=txsync-dc3.txsync-dc3.svc.cluster.local:7001" in store
    # The internal API only on the pod's loopback, where its coordinator and dispatch are.
    assert "--internal-listen=127.0.0.1:7006" in store
    assert "--store=127.0.0.1:7006" in coordinator
    assert "--store=127.0.0.1:7006" in containers["worker-dispatch"]["args"]
    for container in containers.values():
        probe = container["readinessProbe"]
        assert probe["grpc"]["port"] in (7004, 7005, 7007), "gRPC health, no TCP fallback"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # TLS on the client port: the kubelet's gRPC probe speaks none, so it asks a
    # plaintext port that serves health alone.
    assert containers["transaction-store"]["readinessProbe"] == {
        "grpc": {"port": 7007}, "periodSeconds": 5,
    }  # fmt: skip
    assert "--health-listen=0.0.0.0:7007" in store
    assert "--tls-cert=/etc/txsync/tls/tls.crt" in store
    assert "--peer-tls-ca=/etc/txsync/tls/ca.crt" in store
    env = {e["name"]: e.get("value") for e in containers["worker-dispatch"]["env"]}
    assert (
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger.observability.svc.cluster.local:4317"
    )
    kinds = {o["kind"] for o in objects}
    assert "NetworkPolicy" in kinds, "on by default: internal ports answer the DC's own pods"
    text = notes(values, "txsync-dc2", "txsync-dc2")
    assert "txsync status --endpoints 127.0.0.1:7001" in text
    assert "kubectl -n txsync-dc2 scale statefulset txsync-dc2-workers" in text


def test_each_container_has_its_own_resources_flags_and_environment() -> None:
    """Before, the master's one ``resources`` went to each of its three containers (a pod
    asked three times the request), and no service flag could be set (issue 49)."""
    flag, env = "--history-kept=5000", {"name": "TXSYNC_EXTRA", "value": "1"}
    values = merged(
        example_values("three-dcs", "dc1.yaml"),
        {
            "master": {
                "transactionStore": {"extraArgs": [flag], "extraEnv": [env]},
                "workerDispatch": {"resources": {"requests": {"cpu": "50m"}}},
            },
            "workers": {"extraArgs": ["--steps-max=1000"], "extraEnv": [env]},
        },
    )
    helm_python.Chart.load(CHART).validate_schema(values)
    objects = render(values, "txsync-dc1", "txsync-dc1")
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"]
        for o in objects
        if o["kind"] == "StatefulSet"
    }
    master = {c["name"]: c for c in pods["txsync-dc1-master"]}
    requests = {name: c["resources"]["requests"] for name, c in master.items()}
    assert requests == {
        "transaction-store": {"cpu": "250m", "memory": "256Mi"},
        "sync-coordinator": {"cpu": "250m", "memory": "128Mi"},
        "worker-dispatch": {"cpu": "50m", "memory": "128Mi"},
    }
    store = master["transaction-store"]
    assert store["args"][-1] == flag and flag not in master["sync-coordinator"]["args"]
    assert store["env"][-1] == env
    worker = pods["txsync-dc1-workers"][0]
    assert worker["args"][-1] == "--steps-max=1000" and worker["env"][-1] == env
    for manifest in objects:
        if manifest["kind"] == "StatefulSet":
            kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[-1], strict=True)


def test_workers_may_apply_to_postgresql_one_database_each() -> None:
    conninfo = "host=pg.db.svc dbname=$(POD_NAME) user=txsync sslmode=verify-full"
    values = merged(
        example_values("three-dcs", "dc1.yaml"),
        {"workers": {"postgres": {"conninfo": conninfo, "secretName": "pg-credentials"}}},
    )
    helm_python.Chart.load(CHART).validate_schema(values)
    objects = render(values, "txsync-dc1", "txsync-dc1")
    workers = next(o for o in objects if o["metadata"]["name"] == "txsync-dc1-workers"
                   and o["kind"] == "StatefulSet")  # fmt: skip
    worker = workers["spec"]["template"]["spec"]["containers"][0]
    assert f"--postgres={conninfo}" in worker["args"]
    assert worker["envFrom"] == [{"secretRef": {"name": "pg-credentials"}}]
    assert "POD_NAME" in {e["name"] for e in worker["env"]}, "what $(POD_NAME) expands from"
    kubernetes_validate.validate(workers, KUBERNETES_VERSIONS[-1], strict=True)
    sqlite = render(example_values("three-dcs", "dc1.yaml"), "txsync-dc1", "txsync-dc1")
    assert not [a for o in sqlite if o["kind"] == "StatefulSet"
                for c in o["spec"]["template"]["spec"]["containers"]
                for a in c["args"] if a.startswith("--postgres")]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"master": {"resources": {}}}, "resources"),
        ({"workers": {"replica": 3}}, "replica"),  # a typo fails the install, not ignored
        ({"dashboards": True}, "dashboards"),
        ({"master": {"transactionStore": {"extraArgs": ["history-kept=1"]}}}, "extraArgs"),
        ({"dcs": [{"url": "a:1", "storeUrl": "b:2"}]}, "id"),
        ({"dc": "Not A Dc"}, "dc"),
        ({"workers": {"replicas": -1}}, "replicas"),
        ({"dcs": [{"id": "dc1", "url": "no port", "storeUrl": "b:2"}]}, "url"),
    ],
)
def test_the_schema_refuses_bad_values_naming_the_field(
    change: dict[str, Any], message: str
) -> None:
    values = merged(example_values("three-dcs", "dc1.yaml"), change)
    with pytest.raises(helm_python.HelmValuesError, match=message):
        helm_python.Chart.load(CHART).validate_schema(values)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dc": "dc9"}, 'dc: "dc9" is not in dcs'),
        (
            {
                "dcs": [
                    {"id": "dc1", "url": "a:1", "storeUrl": "b:1"},
                    {"id": "dc1", "url": "c:1", "storeUrl": "d:1"},
                ]
            },
            'the id "dc1" appears twice',
        ),
        ({"tls": {"enabled": True, "secretName": ""}}, "tls.secretName"),
        # Per-release tokens across DCs: every other DC would refuse the caller.
        ({"access": {"secretName": "", "generate": True}}, "txsync access secret"),
    ],
)
def test_rules_beyond_the_schema_fail_the_render_clearly(
    change: dict[str, Any], message: str
) -> None:
    values = merged(example_values("three-dcs", "dc1.yaml"), change)
    with pytest.raises(helm_python.HelmError, match=message):
        render(values, "txsync-dc1", "txsync-dc1")


def test_the_development_jaeger_is_valid_kubernetes() -> None:
    for manifest in yaml.safe_load_all((EXAMPLES / "jaeger.yaml").read_text()):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)


def test_the_tiltfile_parses_and_names_files_that_exist() -> None:
    """No Tilt runs here: its Starlark is checked as the Python subset it is, and every
    path it names must exist."""
    source = (ROOT / "Tiltfile").read_text()
    ast.parse(source)
    named = set(re.findall(r'"((?:k8s|helm|scripts)/[^"\s]+)', source))
    named |= {f"k8s/three-dcs/{dc}.yaml" for dc in ("dc1", "dc2", "dc3")}
    assert named and all((ROOT / path).exists() for path in named), named


def test_with_access_control_every_service_presents_the_service_token() -> None:
    values = merged(example_values("three-dcs", "dc1.yaml"), {"access": {"secretName": "acc"}})
    objects = render(values, "txsync-dc1", "txsync-dc1")
    sets = [o for o in objects if o["kind"] == "StatefulSet"]
    containers = [c for s in sets for c in s["spec"]["template"]["spec"]["containers"]]
    assert sorted(c["name"] for c in containers) == [
        "sync-coordinator", "transaction-store", "worker", "worker-dispatch",
    ]  # fmt: skip
    for container in containers:
        assert "--access-file=/etc/txsync/access/access.toml" in container["args"]
        token = next(e for e in container["env"] if e["name"] == "TXSYNC_SERVICE_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "acc", "key": "service-token"}


def _one_dc(access: dict[str, Any]) -> dict[str, Any]:
    values = example_values("three-dcs", "dc1.yaml")
    return merged(values, {"dcs": values["dcs"][:1], "access": access})


def test_access_control_is_on_by_default_with_generated_tokens() -> None:
    """A single DC with no secret named: the chart makes one (a service token, an admin
    token and the access file naming their SHA-256), and every service requires tokens.
    With more DCs it refuses to (test_rules_beyond_the_schema_fail_the_render_clearly)."""
    objects = render(_one_dc({"secretName": ""}), "txsync-dc1", "txsync-dc1")
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret["metadata"]["name"] == "txsync-dc1-access"
    data = secret["stringData"]
    assert len(data["service-token"]) == 40 and data["admin-token"] != data["service-token"]
    access = tomllib.loads(data["access.toml"])
    digests = {t["role"]: t["sha256"] for t in access["token"]}
    for role, token in (("service", data["service-token"]), ("admin", data["admin-token"])):
        assert digests[role] == hashlib.sha256(token.encode()).hexdigest()
    sets = [o for o in objects if o["kind"] == "StatefulSet"]
    for container in (c for s in sets for c in s["spec"]["template"]["spec"]["containers"]):
        assert "--access-file=/etc/txsync/access/access.toml" in container["args"]
        token = next(e for e in container["env"] if e["name"] == "TXSYNC_SERVICE_TOKEN")
        assert token["valueFrom"]["secretKeyRef"]["name"] == "txsync-dc1-access"
    off = _one_dc({"secretName": "", "generate": False})
    open_objects = render(off, "txsync-dc1", "txsync-dc1")
    assert not [o for o in open_objects if o["kind"] == "Secret"]
    assert not any(
        "--access-file" in " ".join(c["args"])
        for s in open_objects if s["kind"] == "StatefulSet"
        for c in s["spec"]["template"]["spec"]["containers"]
    )  # fmt: skip


def test_the_chart_passes_the_flags_dev_up_does() -> None:
    """Both start the services from one builder's flags (``txsync.command_lines``): the
    chart may add what only a pod needs (TLS, access, probes' ports), never lack one."""
    values = example_values("three-dcs", "dc1.yaml")
    objects = render(values, "txsync-dc1", "txsync-dc1")
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "StatefulSet"]
    rendered = {c["name"]: flags(c["args"]) for pod in pods for c in pod["containers"]}
    built = {
        "transaction-store": store_args(
            "dc1",
            "d",
            "a:1",
            coordinator="a:2",
            dispatch="a:3",
            peer_stores={"dc2": "a:4"},
            metrics_listen="a:5",
        ),
        "sync-coordinator": coordinator_args("dc1", "a:1", "a:2", peers={"dc2": "a:6"}),
        "worker-dispatch": dispatch_args("a:1", "a:3", "dc1", workers={}, metrics_listen="a:5"),
        "worker": worker_args("w1", "dc1", "d", "a:7"),
    }
    pod_only = {"--plaintext"}  # the chart speaks TLS between DCs (--tls-*) instead
    for service, args in built.items():
        missing = flags(args) - pod_only - rendered[service]
        assert not missing, f"the chart's {service} lacks {sorted(missing)}"
