"""The recipes in deploy/ (docker compose, Kubernetes, Slurm) parse, and every command they run
is one the `runtime` command accepts, with the role variables `runtime.services.node` reads and
scenarios that exist: a flag renamed in the CLI breaks this test, not a deployment."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from runtime import cli
from runtime.network.curve import KEYS_VAR
from runtime.services.node import ENV_VARS, resolve_role

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SHELL_VALUE = re.compile(r"\$\(\(.*?\)\)|\$\{?\w+\}?|\$\(\w+\)")
"""A value the shell or Kubernetes fills in: $X, ${X}, $((...)), $(X)."""


def parsed(command: list[str]) -> Any:
    """`command` (``runtime ...``) parsed by the `runtime` command's own parser, each value the
    shell or Kubernetes fills in replaced by a number (it stands for an index or a name)."""
    assert command[0] == "runtime", command
    args = [SHELL_VALUE.sub("1", a) for a in command[1:]]
    return cli.build_parser().parse_args(args)


def containers(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = document.get("spec", {})
    yield from spec.get("template", {}).get("spec", {}).get("containers", [])


DOWNWARD = {"metadata.name": "pserver-0"}
"""What the downward API gives the first pod, for a field without another stand-in ("1")."""


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as Kubernetes makes it: downward-API values by their stand-in,
    each ``$(NAME)`` of an earlier variable replaced by its value."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        value = str(e["value"]) if "value" in e else DOWNWARD.get(field, "1")
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), value)
    return env


def check_node(command: list[str], env: dict[str, str]) -> None:
    """A node's command and environment name one role of a job, a scenario of this repository
    and the output directory `runtime collect` reads."""
    args = parsed(command)
    assert args.command == "up" and (ROOT / args.scenario).is_file(), command
    assert args.out is not None, f"{command}: no --out, nothing for runtime collect"
    paddle = {k: SHELL_VALUE.sub("1", v) for k, v in env.items() if k in ENV_VARS}
    role = resolve_role(args.role, args.index, args.endpoints, paddle)
    assert role is not None, (command, env)
    assert args.bind is None or role.role == "pserver"
    assert env.get(KEYS_VAR) or args.keys, f"{command}: no keys: the job would not start"


def test_docker_compose_runs_every_node_of_the_job() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert sorted(services) == ["pserver0", "pserver1", "trainer0", "trainer1"]
    for name, service in services.items():
        check_node(service["command"], service["environment"])
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        if name.startswith("pserver"):
            assert f"{service['environment']['POD_IP']}:6170" in \
                service["environment"]["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")
    assert (DEPLOY / "Dockerfile").read_text().count("FROM python:3.12") == 1


def test_kubernetes_manifests_run_pservers_and_trainers_by_paddles_variables() -> None:
    documents = [d for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
                 for d in yaml.safe_load_all(path.read_text())]
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == ["Job", "Service", "StatefulSet"]
    roles = set()
    for document in documents:
        for container in containers(document):
            env = env_of(container)
            assert set(env) - {"POD_NAME", KEYS_VAR} <= set(ENV_VARS), env
            check_node(container["command"], env)
            roles.add(env["TRAINING_ROLE"])
    assert roles == {"PSERVER", "TRAINER"}
    (statefulset,) = [d for d in documents if d["kind"] == "StatefulSet"]
    (pserver,) = containers(statefulset)
    endpoints = env_of(pserver)["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")
    assert endpoints == [f"pserver-{j}.pserver:6170" for j in range(statefulset["spec"]["replicas"])]


def sbatch_commands(text: str) -> list[list[str]]:
    """The ``runtime`` commands of the sbatch script, its line continuations joined."""
    joined = text.replace("\\\n", " ")
    return [shlex.split(line[line.index("runtime "):])
            for line in joined.splitlines()
            if "runtime " in line and not line.lstrip().startswith("#")]


def test_the_slurm_script_is_valid_bash_and_runs_runtime_up_and_collect() -> None:
    text = (DEPLOY / "slurm.sbatch").read_text()
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(DEPLOY / "slurm.sbatch")], check=True, timeout=10)
    commands = sbatch_commands(text)
    assert [c[1] for c in commands] == ["keys", "up", "up", "collect"]
    keys = parsed(commands[0])
    assert keys.pservers == 1 and keys.trainers == 1  # "$PSERVERS", "$TRAINERS"
    roles = [parsed(c).role for c in commands[1:3]]
    assert roles == ["pserver", "trainer"]
    assert "export SCENARIO PSERVERS PORT OUT TRAINERS ENDPOINTS PSLAB_KEYS" in text
    for command in commands[1:3]:
        args = parsed(command)
        assert args.out is not None and args.endpoints is not None
    collect = parsed(commands[3])
    assert collect.command == "collect" and collect.output is not None


@pytest.mark.parametrize("name", ["docker-compose.yaml", "kubernetes/pservers.yaml",
                                  "kubernetes/trainers.yaml", "slurm.sbatch"])
def test_each_recipe_says_how_to_merge_the_records(name: str) -> None:
    assert "runtime collect" in (DEPLOY / name).read_text()
