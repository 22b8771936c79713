"""The pipeline's Kubernetes example (``k8s/spark/``, issue 54), checked as the chart is.

No Kubernetes and no spark-operator run here, and the operator's CRD schema is not on
this machine. So: every core object against the Kubernetes API schemas; the
SparkApplication's fields against the v1beta2 fields the spark-operator documents; its
driver and executor as the pods the operator makes of them (core types: env, volumes,
security contexts); its arguments through the job's own parser; and its names against
what they name (the chart's secrets, the image's paths and user, the example DCs). The
image itself runs under Docker in ``tests/pipeline/test_spark_clusters.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pyspark
import pytest
import yaml

from tests.deploy.test_chart import KUBERNETES_VERSIONS
from txsync.pipeline.command import parse_arguments

ROOT = Path(__file__).resolve().parents[2]
SPARK = ROOT / "k8s" / "spark"
SPEC_FIELDS = {
    "type", "pythonVersion", "mode", "image", "imagePullPolicy", "mainApplicationFile",
    "arguments", "sparkVersion", "restartPolicy", "volumes", "driver", "executor",
    "sparkConf", "hadoopConf", "deps", "timeToLiveSeconds",
}  # fmt: skip
"""Fields of ``SparkApplicationSpec`` (sparkoperator.k8s.io/v1beta2) the example may use."""
POD_FIELDS = {
    "cores", "coreLimit", "memory", "memoryOverhead", "instances", "serviceAccount", "env",
    "volumeMounts", "securityContext", "labels", "annotations", "nodeSelector",
    "tolerations",
}  # fmt: skip
"""Fields of its ``DriverSpec`` / ``ExecutorSpec`` the example may use."""


def _objects() -> list[dict[str, Any]]:
    return [
        document
        for path in sorted(SPARK.glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


def _application() -> dict[str, Any]:
    (application,) = [o for o in _objects() if o["kind"] == "SparkApplication"]
    return application


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_core_object_is_valid(version: str) -> None:
    core = [o for o in _objects() if o["kind"] != "SparkApplication"]
    assert {o["kind"] for o in core} == {"ServiceAccount", "Role", "RoleBinding"}
    for manifest in core:
        kubernetes_validate.validate(manifest, version, strict=True)


def _pod(application: dict[str, Any], role: str) -> dict[str, Any]:
    """The pod the operator makes for the driver or an executor, in the parts the
    SparkApplication gives it (Spark adds its own settings on top)."""
    spec, part = application["spec"], application["spec"][role]
    container: dict[str, Any] = {"name": f"spark-kubernetes-{role}", "image": spec["image"]}
    for key in ("env", "volumeMounts", "securityContext"):
        if key in part:
            container[key] = part[key]
    pod_spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
    if "serviceAccount" in part:
        pod_spec["serviceAccountName"] = part["serviceAccount"]
    if "volumes" in spec:
        pod_spec["volumes"] = spec["volumes"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": role}, "spec": pod_spec}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_application_is_made_of_valid_pods(version: str) -> None:
    application = _application()
    assert application["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    spec = application["spec"]
    assert set(spec) <= SPEC_FIELDS, set(spec) - SPEC_FIELDS
    assert spec["type"] == "Python" and spec["mode"] == "cluster"
    for role in ("driver", "executor"):
        assert set(spec[role]) <= POD_FIELDS, set(spec[role]) - POD_FIELDS
        kubernetes_validate.validate(_pod(application, role), version, strict=True)


def test_its_names_are_those_of_the_image_the_chart_and_the_rbac() -> None:
    application, objects = _application(), _objects()
    spec, driver = application["spec"], application["spec"]["driver"]
    dockerfile = (SPARK / "Dockerfile").read_text()
    # The application file the image links, and the image's user.
    application_file = spec["mainApplicationFile"].removeprefix("local://")
    assert (
        f'ln -s "$(/opt/txsync/bin/python -m txsync.pipeline.command --path)" {application_file}'
        in dockerfile
    )
    uid = re.search(r"useradd --uid (\d+)", dockerfile)
    assert uid is not None
    for role in ("driver", "executor"):
        assert spec[role]["securityContext"]["runAsUser"] == int(uid.group(1))
    assert spec["sparkVersion"] == pyspark.__version__, "the PySpark the image installs"
    # The driver's service account, with the Role that lets it make executors.
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert driver["serviceAccount"] == account["metadata"]["name"]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    (driver_role,) = [o for o in objects if o["kind"] == "Role"]
    assert binding["roleRef"]["name"] == driver_role["metadata"]["name"]
    granted = {r for rule in driver_role["rules"] for r in rule["resources"]}
    assert {"pods", "services", "configmaps"} <= granted
    namespaces = {o["metadata"]["namespace"] for o in objects}
    assert len(namespaces) == 1, "the secrets it mounts live in the release's namespace"
    # The chart's secrets: the TLS secret's CA and a token of the access secret.
    cluster = yaml.safe_load((ROOT / "k8s" / "three-dcs" / "cluster.yaml").read_text())
    (volume,) = spec["volumes"]
    assert volume["secret"]["secretName"] == cluster["tls"]["secretName"]
    assert [item["key"] for item in volume["secret"]["items"]] == ["ca.crt"]
    (token,) = [e for e in driver["env"] if e["name"] == "TXSYNC_TOKEN"]
    reference = token["valueFrom"]["secretKeyRef"]
    assert reference["name"] == cluster["access"]["secretName"]
    chart_secret = (ROOT / "helm" / "txsync" / "templates" / "access-secret.yaml").read_text()
    assert f'index .data "{reference["key"]}"' in chart_secret
    # The job's arguments, as the job parses them: the example's DCs, the mounted CA.
    options = parse_arguments(spec["arguments"])
    assert options.command == "pipeline"
    stores = dict(entry.split("=", 1) for entry in options.endpoints.split(","))
    assert stores == {dc["id"]: dc["storeUrl"] for dc in cluster["dcs"]}
    (mount,) = driver["volumeMounts"]
    assert Path(options.tls_ca).parent == Path(mount["mountPath"])
