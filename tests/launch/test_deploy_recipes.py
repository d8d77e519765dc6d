"""The recipes in deploy/ (docker compose, Kubernetes, Slurm) parse, and every command they run
is one the `runtime` command accepts, with the role variables `runtime.services.node` reads and
scenarios that exist: a flag renamed in the CLI breaks this test, not a deployment.

And each node of each recipe is given its own secret key and no other node's: the commands a
recipe's header (or the Slurm script itself) runs to make and hand out the keys are run here,
with stand-ins for docker, kubectl, srun and the nodes, and what every node can read is listed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime import cli
from runtime.config.nodes import node_file_stem
from runtime.network.curve import KEYS_VAR
from runtime.network.curve import SECRET_SUFFIX
from runtime.services.node import ENV_VARS, resolve_role

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SHELL_VALUE = re.compile(r"\$\(\(.*?\)\)|\$\{?\w+\}?|\$\(\w+\)")
"""A value the shell or Kubernetes fills in: $X, ${X}, $((...)), $(X)."""


def parsed(command: list[str]) -> Any:
    """`command` (``runtime ...``) parsed by the `runtime` command's own parser, each value the
    shell or Kubernetes fills in replaced by a number (it stands for an index or a name)."""
    assert command[0] == "runtime", command
    args = [SHELL_VALUE.sub("1", a) for a in command[1:]]
    return cli.build_parser().parse_args(args)


def env_of(container: dict[str, Any], document: dict[str, Any]) -> dict[str, str]:
    """A container's environment as Kubernetes makes it in `document`'s pod: ``metadata.name``
    from the downward API the pod's name (its template's stand-in: "1"), each ``$(NAME)`` of an
    earlier variable replaced by its value."""
    downward = {"metadata.name": document["metadata"]["name"] if document["kind"] == "Pod"
                else "1"}
    env: dict[str, str] = {}
    for e in container.get("env", []):
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        value = str(e["value"]) if "value" in e else downward.get(field, "1")
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), value)
    return env


def check_node(command: list[str], env: dict[str, str]) -> str:
    """A node's command and environment name one role of a job, a scenario of this repository
    and the output directory `runtime collect` reads; the node's file stem (``trainer-1``)."""
    args = parsed(command)
    assert args.command == "up" and (ROOT / args.scenario).is_file(), command
    assert args.out is not None, f"{command}: no --out, nothing for runtime collect"
    paddle = {k: SHELL_VALUE.sub("1", v) for k, v in env.items() if k in ENV_VARS}
    role = resolve_role(args.role, args.index, args.endpoints, paddle)
    assert role is not None, (command, env)
    assert args.bind is None or role.role == "pserver"
    assert env.get(KEYS_VAR) or args.keys, f"{command}: no keys: the job would not start"
    return node_file_stem(role.role, role.index)


# -- who holds which secret key -------------------------------------------------------------------

STUBS = {
    # the real `runtime keys`; any other runtime command is a node: it says what its host holds
    "runtime": """#!/bin/bash
case $1 in
  keys) exec "$PYTHON" -m runtime.cli "$@" ;;
  up) { echo "$PSLAB_KEYS"; echo $(ls "$PSLAB_KEYS")
        echo $(find "$TMPDIR" -name '*.key_secret' -printf '%f\\n' | sort)
        printf '%s\\n' "$@"; } > "$LOG/node-$SLURM_PROCID" ;;
esac""",
    # a Secret is the files of the directory it is made from
    "kubectl": """#!/bin/bash
[ "$1 $2" = "create secret" ] && echo "$4 ${5#--from-file=}" >> "$LOG/secrets" || true""",
    "docker": "#!/bin/bash\ntrue",
    "scontrol": "#!/bin/bash\nprintf 'host%s\\n' 0 1 2 3 4 5 6 7 | head -n \"$SLURM_NTASKS\"",
    # each task a process on its host, that host's local storage its TMPDIR
    "srun": """#!/bin/bash
relative=
while [[ $1 == --* ]]; do [[ $1 == --relative=* ]] && relative=${1#--relative=}; shift; done
if [ -n "$relative" ]; then SLURM_PROCID=$relative TMPDIR=$STUB_HOSTS/$relative exec "$@"; fi
for ((t = 0; t < SLURM_NTASKS; t++)); do
  SLURM_PROCID=$t TMPDIR=$STUB_HOSTS/$t "$@" < /dev/null
done""",
}


def stand_ins(tmp_path: Path) -> dict[str, str]:
    """An environment whose docker, kubectl, srun, scontrol and runtime are the stand-ins above,
    with a log directory and Slurm's variables for a 4-task job."""
    bin_dir, log, hosts = tmp_path / "bin", tmp_path / "log", tmp_path / "hosts"
    for directory in (bin_dir, log, *(hosts / str(t) for t in range(4))):
        directory.mkdir(parents=True)
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text + "\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "LOG": str(log),
            "STUB_HOSTS": str(hosts), "TMPDIR": str(hosts / "0"), "SLURM_JOB_ID": "7",
            "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "host[0-3]"}


def run_header(recipe: Path, cwd: Path) -> dict[str, str]:
    """Run the shell commands of `recipe`'s header (indented comment lines; not those in
    parentheses, which say when to run one) in `cwd`, with the stand-ins; their environment."""
    lines = [line[1:].strip() for line in recipe.read_text().splitlines()
             if line.startswith("#   ") and not line[1:].strip().startswith("(")]
    env = stand_ins(cwd / ".test")
    subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd=cwd, env=env,
                   check=True, timeout=120)
    return env


def secrets_under(paths: list[Path]) -> set[str]:
    """The secret key files a node can read under `paths` (files or directories)."""
    found = set()
    for path in paths:
        found |= {p.name for p in [path, *path.rglob("*")] if p.name.endswith(SECRET_SUFFIX)}
    return found


def test_each_container_of_the_compose_file_holds_only_its_own_secret_key(tmp_path: Path) -> None:
    (tmp_path / "deploy" / "out").mkdir(parents=True)  # docker makes it
    run_header(DEPLOY / "docker-compose.yaml", tmp_path)
    assert (tmp_path / "deploy" / "keys" / "trainer-1.key_secret").is_file()
    services = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())["services"]
    for name, service in services.items():
        stem = check_node(service["command"], service["environment"])
        hosts = [tmp_path / "deploy" / v.split(":")[0] for v in service.get("volumes", [])]
        assert all(h.exists() for h in hosts), (name, hosts)
        assert secrets_under(hosts) == {stem + SECRET_SUFFIX}, name
        assert "/keys" in [v.split(":")[1] for v in service["volumes"]]
    # the image holds no key: COPY . leaves them out
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "**/*.key_secret" in ignored and "deploy/keys" in ignored


def test_each_kubernetes_pod_mounts_only_its_own_secret_key(tmp_path: Path) -> None:
    env = run_header(DEPLOY / "kubernetes" / "pservers.yaml", tmp_path)
    secrets = {name: tmp_path / directory for name, directory in
               (line.split() for line in (Path(env["LOG"]) / "secrets").read_text().splitlines())}
    assert len(secrets) == 4
    pods = 0
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            spec = document.get("spec", {})
            spec = spec.get("template", {}).get("spec", spec)
            for container in spec.get("containers", []):
                stem = check_node(container["command"], env_of(container, document))
                mounted = {m["name"] for m in container.get("volumeMounts", [])}
                volumes = [v for v in spec.get("volumes", []) if v["name"] in mounted]
                sources = [s.get("secret") for v in volumes
                           for s in [v, *v.get("projected", {}).get("sources", [])]]
                names = [s["secretName" if "secretName" in s else "name"] for s in sources if s]
                assert all(set(v) <= {"name", "secret", "persistentVolumeClaim"}
                           for v in volumes), volumes
                assert secrets_under([secrets[n] for n in names]) == {stem + SECRET_SUFFIX}
                pods += 1
    assert pods == 4


def test_each_slurm_task_holds_only_its_own_secret_key(tmp_path: Path) -> None:
    env = stand_ins(tmp_path)
    env["OUT"] = str(tmp_path / "out")
    subprocess.run(["bash", str(DEPLOY / "slurm.sbatch")], cwd=ROOT, env=env, check=True,
                   timeout=120)
    hosts, log = Path(env["STUB_HOSTS"]), Path(env["LOG"])
    for task in range(4):
        lines = (log / f"node-{task}").read_text().splitlines()
        args = cli.build_parser().parse_args(lines[3:])
        stem = node_file_stem(args.role, args.index)
        assert stem == (f"pserver-{task}" if task < 2 else f"trainer-{task - 2}")
        assert lines[0] == str(hosts / str(task) / "pslab-keys-7")
        assert lines[1].split() == sorted(
            [f"{s}.key" for s in ["pserver-0", "pserver-1", "trainer-0", "trainer-1"]]
            + [stem + SECRET_SUFFIX])
        assert lines[2] == stem + SECRET_SUFFIX  # every secret its host holds
    # nothing left: not on the hosts, not on the shared file system
    assert secrets_under([hosts, tmp_path / "out"]) == set()
    assert [p for p in hosts.rglob("*") if p.parent != hosts] == []


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
    assert kinds == ["Job", "Job", "PersistentVolumeClaim", "Pod", "Pod", "Service"]
    roles = set()
    for document in documents:
        spec = document.get("spec", {})
        for container in spec.get("template", {}).get("spec", spec).get("containers", []):
            env = env_of(container, document)
            assert set(env) - {"POD_NAME", KEYS_VAR} <= set(ENV_VARS), env
            check_node(container["command"], env)
            roles.add(env["TRAINING_ROLE"])
    assert roles == {"PSERVER", "TRAINER"}
    (service,) = [d for d in documents if d["kind"] == "Service"]
    pods = [d for d in documents if d["kind"] == "Pod"]
    for j, pod in enumerate(pods):
        # pserver-J.pserver: the pod's hostname in the Service's subdomain
        assert (pod["metadata"]["name"], pod["spec"]["hostname"], pod["spec"]["subdomain"]) == \
            (f"pserver-{j}", f"pserver-{j}", service["metadata"]["name"])
        assert pod["metadata"]["labels"].items() >= service["spec"]["selector"].items()
        env = env_of(pod["spec"]["containers"][0], pod)
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",") == \
            [f"pserver-{i}.pserver:6170" for i in range(len(pods))]
        assert env["POD_IP"] == f"pserver-{j}.pserver"


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
    assert [c[1] for c in commands] == ["keys", "keys", "up", "up", "collect"]
    keys = parsed(commands[0])
    assert keys.pservers == 1 and keys.trainers == 1  # "$PSERVERS", "$TRAINERS"
    assert parsed(commands[1]).export is not None
    roles = [parsed(c).role for c in commands[2:4]]
    assert roles == ["pserver", "trainer"]
    assert "export SCENARIO PSERVERS PORT OUT TRAINERS ENDPOINTS" in text
    for command in commands[2:4]:
        args = parsed(command)
        assert args.out is not None and args.endpoints is not None
    collect = parsed(commands[4])
    assert collect.command == "collect" and collect.output is not None


@pytest.mark.parametrize("name", ["docker-compose.yaml", "kubernetes/pservers.yaml",
                                  "kubernetes/trainers.yaml", "slurm.sbatch"])
def test_each_recipe_says_how_to_merge_the_records(name: str) -> None:
    assert "runtime collect" in (DEPLOY / name).read_text()
