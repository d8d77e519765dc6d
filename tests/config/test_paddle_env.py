"""Every name Paddle's launchers gave a fact names that fact to `runtime up --role`
(`runtime.config.paddle_env`), two that disagree are refused in one line naming both, and flags
come before the variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import cli
from runtime.config.paddle_env import ENV_VARS, PaddleNode, RoleError, paddle_node
from runtime.services.node import Role, resolve_role

ROOT = Path(__file__).resolve().parents[2]
EP = "10.0.0.1:6170,10.0.0.2:6170"
EPS = ("10.0.0.1:6170", "10.0.0.2:6170")
TRAINER = {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": EP,
           "PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_ID": "1"}
PSERVER = {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": EP,
           "PADDLE_TRAINERS_NUM": "3", "POD_IP": "10.0.0.2", "PADDLE_PORT": "6170"}


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def test_fleets_variables_name_a_trainer_and_a_pserver() -> None:
    assert paddle_node(TRAINER) == PaddleNode("trainer", 1, "PADDLE_TRAINER_ID", EPS,
                                              "PADDLE_PSERVERS_IP_PORT_LIST", 3)
    assert paddle_node(PSERVER) == PaddleNode("pserver", 1, "POD_IP:PADDLE_PORT", EPS,
                                              "PADDLE_PSERVERS_IP_PORT_LIST", 3)
    assert paddle_node({"POD_IP": "10.0.0.2", "PADDLE_TRAINER_ID": "0"}) is None


@pytest.mark.parametrize("env,field,value", [
    ({**without(TRAINER, "TRAINING_ROLE"), "PADDLE_TRAINING_ROLE": "trainer"}, "role",
     "trainer"),
    ({**without(TRAINER, "PADDLE_PSERVERS_IP_PORT_LIST"), "PADDLE_PSERVER_ENDPOINTS": EP},
     "endpoints_source", "PADDLE_PSERVER_ENDPOINTS"),
    ({**without(TRAINER, "PADDLE_PSERVERS_IP_PORT_LIST"), "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2",
      "PADDLE_PSERVER_PORT": "6170"}, "endpoints", EPS),
    ({**without(TRAINER, "PADDLE_TRAINERS_NUM"), "PADDLE_TRAINERS": "3"}, "trainers", 3),
    ({**without(TRAINER, "PADDLE_TRAINERS_NUM"), "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1,c:1"},
     "trainers", 3),
    ({**without(TRAINER, "PADDLE_TRAINER_ID"), "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1,c:1",
      "PADDLE_CURRENT_ENDPOINT": "c:1"}, "index", 2),
    ({**without(PSERVER, "POD_IP", "PADDLE_PORT"), "PADDLE_CURRENT_ENDPOINT": "10.0.0.1:6170"},
     "index", 0),
    ({**without(PSERVER, "POD_IP", "PADDLE_PORT"), "PADDLE_CURRENT_IP": "10.0.0.1",
      "PADDLE_PSERVER_PORT": "6170"}, "index_source", "PADDLE_CURRENT_IP:PADDLE_PSERVER_PORT"),
    ({**without(PSERVER, "PADDLE_PORT"), "PADDLE_PSERVER_PORT": "6170"}, "index", 1),
    ({**PSERVER, "PADDLE_PSERVER_NUMS": "2"}, "index", 1),
])
def test_each_of_paddles_names_gives_its_fact(env: dict[str, str], field: str,
                                              value: object) -> None:
    node = paddle_node(env)
    assert node is not None and getattr(node, field) == value
    assert set(env) <= set(ENV_VARS)  # runtime up keeps each from the nodes it starts


@pytest.mark.parametrize("env", [
    {**TRAINER, "PADDLE_TRAINING_ROLE": "trainer"},
    {**TRAINER, "PADDLE_PSERVER_ENDPOINTS": "10.0.0.1:6170, 10.0.0.2:6170"},
    {**TRAINER, "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2", "PADDLE_PSERVER_PORT": "6170"},
    {**TRAINER, "PADDLE_TRAINERS": "3", "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1,c:1",
     "PADDLE_CURRENT_ENDPOINT": "b:1"},
    {**PSERVER, "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6170", "PADDLE_CURRENT_IP": "10.0.0.2"},
])
def test_names_that_agree_are_one_fact_named_by_the_first(env: dict[str, str]) -> None:
    assert paddle_node(env) == paddle_node(TRAINER if env["TRAINING_ROLE"] == "TRAINER"
                                           else PSERVER)


@pytest.mark.parametrize("env,message", [
    ({**TRAINER, "PADDLE_TRAINING_ROLE": "PSERVER"},
     "TRAINING_ROLE=TRAINER and PADDLE_TRAINING_ROLE=PSERVER name different roles; set one of "
     "them"),
    ({**TRAINER, "PADDLE_PSERVER_ENDPOINTS": "10.0.0.1:6170"},
     f"PADDLE_PSERVERS_IP_PORT_LIST={EP} and PADDLE_PSERVER_ENDPOINTS=10.0.0.1:6170 name "
     "different pserver endpoints; set one of them"),
    ({**TRAINER, "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2", "PADDLE_PSERVER_PORT": "7000"},
     f"PADDLE_PSERVERS_IP_PORT_LIST={EP} and PADDLE_PSERVER_IPS:PADDLE_PSERVER_PORT="
     "10.0.0.1:7000,10.0.0.2:7000 name different pserver endpoints; set one of them"),
    ({**TRAINER, "PADDLE_TRAINERS": "2"},
     "PADDLE_TRAINERS_NUM=3 and PADDLE_TRAINERS=2 name different trainer counts"),
    ({**TRAINER, "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1"},
     "PADDLE_TRAINERS_NUM=3 and PADDLE_TRAINER_ENDPOINTS=a:1,b:1 name different trainer counts"),
    ({**TRAINER, "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1,c:1", "PADDLE_CURRENT_ENDPOINT": "a:1"},
     "PADDLE_TRAINER_ID=1 and PADDLE_CURRENT_ENDPOINT=a:1 name different trainer indexes"),
    ({**PSERVER, "PADDLE_CURRENT_ENDPOINT": "10.0.0.1:6170"},
     "POD_IP:PADDLE_PORT=10.0.0.2:6170 and PADDLE_CURRENT_ENDPOINT=10.0.0.1:6170 name different "
     "endpoints of this pserver"),
    ({**PSERVER, "PADDLE_CURRENT_IP": "10.0.0.1"},
     "POD_IP=10.0.0.2 and PADDLE_CURRENT_IP=10.0.0.1 name different hosts"),
    ({**PSERVER, "PADDLE_PSERVER_PORT": "7000"},
     "PADDLE_PORT=6170 and PADDLE_PSERVER_PORT=7000 name different ports"),
    ({**PSERVER, "PADDLE_PSERVER_NUMS": "3"},
     f"PADDLE_PSERVER_NUMS=3 and PADDLE_PSERVERS_IP_PORT_LIST={EP} name different pserver counts"),
])
def test_two_names_that_disagree_are_refused_naming_both(env: dict[str, str],
                                                         message: str) -> None:
    with pytest.raises(RoleError) as err:
        paddle_node(env)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("env,message", [
    ({**without(TRAINER, "PADDLE_PSERVERS_IP_PORT_LIST"), "PADDLE_PSERVER_IPS": "10.0.0.1"},
     "PADDLE_PSERVER_PORT is not set; PADDLE_PSERVER_IPS needs it"),
    ({**without(PSERVER, "POD_IP")}, "POD_IP is not set; TRAINING_ROLE=PSERVER needs it with "
     "PADDLE_PORT"),
    ({**without(PSERVER, "POD_IP", "PADDLE_PORT")},
     "PADDLE_CURRENT_ENDPOINT is not set; TRAINING_ROLE=PSERVER needs it (or POD_IP with "
     "PADDLE_PORT)"),
    ({**without(TRAINER, "PADDLE_TRAINER_ID")}, "PADDLE_TRAINER_ID is not set"),
    ({**without(TRAINER, "PADDLE_TRAINER_ID"), "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1,c:1",
      "PADDLE_CURRENT_ENDPOINT": "d:1"},
     "PADDLE_CURRENT_ENDPOINT d:1 is not in PADDLE_TRAINER_ENDPOINTS a:1,b:1,c:1"),
    ({**without(PSERVER, "POD_IP", "PADDLE_PORT"), "PADDLE_CURRENT_ENDPOINT": "a:1,b:1"},
     "PADDLE_CURRENT_ENDPOINT='a:1,b:1': expected one host:port"),
    ({**PSERVER, "PADDLE_PORT": "70000"}, "PADDLE_PORT=70000 is not a port"),
    ({**without(TRAINER, "PADDLE_TRAINERS_NUM"), "PADDLE_TRAINERS": "3",
      "PADDLE_TRAINER_ID": "3"}, "PADDLE_TRAINER_ID=3 is not below PADDLE_TRAINERS=3"),
])
def test_a_missing_or_bad_variable_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(RoleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        paddle_node(env)


def test_a_pserver_with_its_current_endpoint_ignores_a_lone_host() -> None:
    """Kubernetes sets POD_IP for every pod: with PADDLE_CURRENT_ENDPOINT it needs no port."""
    env = {**without(PSERVER, "PADDLE_PORT"), "PADDLE_CURRENT_ENDPOINT": "10.0.0.1:6170"}
    node = paddle_node(env)
    assert node is not None and (node.index, node.index_source) == (0, "PADDLE_CURRENT_ENDPOINT")


def test_flags_come_before_the_variables() -> None:
    env = {**TRAINER, "PADDLE_PSERVER_ENDPOINTS": "10.9.9.9:1"}  # would be refused
    assert resolve_role("trainer", 0, "h:1", env) == Role("trainer", 0, "--index", ("h:1",))
    with pytest.raises(RoleError, match="--role pserver contradicts PADDLE_TRAINING_ROLE=trainer"):
        resolve_role("pserver", 0, None, {"PADDLE_TRAINING_ROLE": "trainer"})
    with pytest.raises(RoleError, match="--endpoints needs --role; with PADDLE_TRAINING_ROLE set"):
        resolve_role(None, None, "h:1", {"PADDLE_TRAINING_ROLE": "trainer"})


def test_runtime_up_reads_the_variables_through_the_mapping() -> None:
    env = {"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_PSERVER_ENDPOINTS": EP,
           "PADDLE_TRAINERS": "2", "PADDLE_CURRENT_ENDPOINT": "10.0.0.1:6170"}
    assert resolve_role(None, None, None, env) == Role(
        "pserver", 0, "PADDLE_CURRENT_ENDPOINT", EPS, "PADDLE_PSERVER_ENDPOINTS", 2)


def test_runtime_up_refuses_a_conflict_as_a_usage_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in {**TRAINER, "PADDLE_PSERVER_ENDPOINTS": "10.9.9.9:1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["up", str(ROOT / "scenarios" / "quickstart.yaml")])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"runtime up: error: PADDLE_PSERVERS_IP_PORT_LIST={EP} and "
                    "PADDLE_PSERVER_ENDPOINTS=10.9.9.9:1 name different pserver endpoints; "
                    "set one of them")
