"""The recipes of deploy/ are complete and valid as their tools read them: every volume claim a pod
names is defined, every image is pinned to the package's version (not ``latest``, pulled only
where a node lacks it), every environment variable a recipe sets is one ``runtime up`` reads;
and, where the tools install here, the Kubernetes manifests validate against the Kubernetes API
schemas (``kubernetes-validate``, in the ``[dev]`` extra) and the compose file passes ``docker
compose config``."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime.config.paddle_env import ENV_VARS
from runtime.network.curve import KEYS_VAR

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"pslab:{VERSION}"
READ_BY_RUNTIME_UP = {*ENV_VARS, KEYS_VAR}
REFERENCE = re.compile(r"\$\((\w+)\)")
"""A variable Kubernetes fills into a value or a command: $(NAME)."""


def manifests() -> list[dict[str, Any]]:
    """Every document of deploy/kubernetes/, its file's name under ``_file``."""
    return [{**document, "_file": path.name}
            for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
            for document in yaml.safe_load_all(path.read_text()) if document]


def pod_spec(document: dict[str, Any]) -> dict[str, Any] | None:
    """The pod a Pod, Job or other workload runs; None for a document that runs none."""
    spec = document.get("spec", {})
    spec = spec.get("template", {}).get("spec", spec)
    return spec if "containers" in spec else None


def containers() -> list[tuple[str, dict[str, Any]]]:
    """Every container of the manifests, with its document's kind and name."""
    return [(f"{d['kind']} {d['metadata']['name']}", c) for d in manifests()
            if (spec := pod_spec(d)) is not None for c in spec["containers"]]


def compose_services() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


# -- always --------------------------------------------------------------------------------------

def test_every_claim_a_pod_names_is_defined_and_shared() -> None:
    claims = {d["metadata"]["name"]: d for d in manifests()
              if d["kind"] == "PersistentVolumeClaim"}
    named = {v["persistentVolumeClaim"]["claimName"] for d in manifests()
             if (spec := pod_spec(d)) is not None for v in spec.get("volumes", [])
             if "persistentVolumeClaim" in v}
    assert named, "no pod mounts a claim: where do the records go?"
    assert named <= set(claims), f"claims named but never defined: {named - set(claims)}"
    for name in named:  # the pods of every node, on different machines, write to it at once
        assert claims[name]["spec"]["accessModes"] == ["ReadWriteMany"], name
    # kubectl apply -f deploy/kubernetes/ applies files by name: the claim before its pods
    first_pod = min(d["_file"] for d in manifests() if pod_spec(d) is not None)
    assert all(claims[name]["_file"] < first_pod for name in named)


def test_every_image_is_pinned_to_the_package_version() -> None:
    for where, container in containers():
        assert container["image"] == IMAGE, where
        assert container.get("imagePullPolicy") == "IfNotPresent", where
    for name, service in compose_services().items():
        assert service["image"] == IMAGE, name
    assert f"-t {IMAGE} ." in (DEPLOY / "Dockerfile").read_text()
    assert f"docker build -f deploy/Dockerfile -t {IMAGE} ." in \
        (DEPLOY / "README.md").read_text()


def referenced(container: dict[str, Any]) -> set[str]:
    """The variables a container's command and environment fill in as $(NAME)."""
    texts = [*container.get("command", []), *container.get("args", []),
             *(str(e.get("value", "")) for e in container.get("env", []))]
    return {name for text in texts for name in REFERENCE.findall(text)}


def test_every_variable_a_recipe_sets_is_one_runtime_up_reads() -> None:
    for where, container in containers():
        names = {e["name"] for e in container.get("env", [])}
        unread = names - READ_BY_RUNTIME_UP - referenced(container)
        assert not unread, f"{where} sets {sorted(unread)}, which runtime up does not read"
    for name, service in compose_services().items():
        unread = set(service["environment"]) - READ_BY_RUNTIME_UP
        assert not unread, f"service {name} sets {sorted(unread)}, which runtime up does not read"


# -- where the tools install ---------------------------------------------------------------------

def validate_manifest(document: dict[str, Any]) -> str | None:
    """What the Kubernetes API schema finds wrong with `document` (strict: no unknown field);
    None when it is valid. Skips the test where kubernetes-validate is not installed."""
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is not installed (the [dev] extra)")
    try:
        kv.validate({k: v for k, v in document.items() if k != "_file"}, kv.latest_version(),
                    strict=True)
    except kv.ValidationError as err:
        return f"{'.'.join(map(str, err.path))}: {err.message}"
    return None


def test_the_manifests_validate_against_the_kubernetes_schemas() -> None:
    for document in manifests():
        problem = validate_manifest(document)
        assert problem is None, f"{document['_file']} {document['kind']}: {problem}"
    pod = next(d for d in manifests() if d["kind"] == "Pod")
    assert validate_manifest({**pod, "spec": {**pod["spec"], "hostnme": "x"}}) is not None


def compose_command() -> list[str]:
    """``docker compose`` (the v2 plugin) or ``docker-compose``; skips where neither runs."""
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither docker compose nor docker-compose is installed (apt: docker-compose)")


def compose_config(path: Path) -> subprocess.CompletedProcess[str]:
    """``config -q`` of the compose file at `path`: parses and validates it, needs no daemon."""
    return subprocess.run([*compose_command(), "-f", str(path), "config", "-q"],
                          capture_output=True, text=True, timeout=60, cwd=path.parent)


def test_the_compose_file_passes_docker_compose_config(tmp_path: Path) -> None:
    result = compose_config(COMPOSE)
    assert result.returncode == 0, result.stderr
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["trainer0"]["restart_policy"] = "never"  # not a compose key
    (tmp_path / "docker-compose.yaml").write_text(yaml.safe_dump(broken))
    assert compose_config(tmp_path / "docker-compose.yaml").returncode != 0
