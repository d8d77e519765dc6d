"""Parity with the original transpiler, continued (docs/transpiler.md): the pservers' RPC thread
counts (`ServerRuntimeConfig`), `lookup_table_v2`, ``distribute_update_vars``, and collective
``single_process_multi_thread``."""

from __future__ import annotations

import pytest
from distribute_helpers import PS1, PS2, basic, listen, pserver, transpile

import transpiler as T
from transpiler.distribute import ServerRuntimeConfig

# -- 1. ServerRuntimeConfig ---------------------------------------------------------------------

RPC_ATTRS = ("rpc_get_thread_num", "rpc_send_thread_num", "rpc_prefetch_thread_num")


def rpc_threads(t: T.DistributeTranspiler, endpoint: str) -> tuple[int, ...]:
    op = listen(pserver(t, endpoint)[0])
    return tuple(op.attr(name) for name in RPC_ATTRS)


def test_server_runtime_config_reads_the_flags_with_the_originals_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in ("send", "get", "prefetch"):
        monkeypatch.delenv(f"FLAGS_rpc_{flag}_thread_num", raising=False)
    c = ServerRuntimeConfig()
    assert (c._rpc_send_thread_num, c._rpc_get_thread_num, c._rpc_prefetch_thread_num) == (12, 12, 12)
    monkeypatch.setenv("FLAGS_rpc_send_thread_num", "3")
    monkeypatch.setenv("FLAGS_rpc_prefetch_thread_num", "5")
    c = ServerRuntimeConfig()
    assert (c._rpc_send_thread_num, c._rpc_get_thread_num, c._rpc_prefetch_thread_num) == (3, 12, 5)
    # the default transpiler reads them too, and writes them where the original did
    assert rpc_threads(transpile(basic()), PS1) == (12, 3, 5)


@pytest.mark.parametrize("geo", [False, True])
def test_server_config_goes_on_every_pservers_listen_and_serv(geo: bool) -> None:
    server = ServerRuntimeConfig()
    server._rpc_send_thread_num, server._rpc_get_thread_num = 4, 6
    server._rpc_prefetch_thread_num = 2
    main, startup = basic()
    t = T.DistributeTranspiler(T.DistributeTranspilerConfig(geo_sgd_mode=geo),
                               server_config=server)
    t.transpile(0, program=main, pservers=f"{PS1},{PS2}", trainers=2, startup_program=startup,
                sync_mode=not geo, in_place=False)
    assert rpc_threads(t, PS1) == rpc_threads(t, PS2) == (6, 4, 2)
    # the original's setter (fleet's way in) replaces it for the next transpile
    other = ServerRuntimeConfig()
    other._rpc_get_thread_num = 1
    t._set_server_config(other)
    t.transpile(0, program=main, pservers=f"{PS1},{PS2}", trainers=2, startup_program=startup,
                sync_mode=not geo, in_place=False)
    assert rpc_threads(t, PS2)[0] == 1


def test_server_config_refuses_what_the_original_refused() -> None:
    with pytest.raises(TypeError, match="server_config: must be a ServerRuntimeConfig"):
        T.DistributeTranspiler(server_config={"_rpc_send_thread_num": 2})  # type: ignore[arg-type]
    bad = ServerRuntimeConfig()
    bad._rpc_prefetch_thread_num = 0
    with pytest.raises(ValueError, match="_rpc_prefetch_thread_num: must be an int >= 1, got 0"):
        T.DistributeTranspiler(server_config=bad)


def test_fluid_exposes_server_runtime_config() -> None:
    import runtime.paddle.fluid as fluid
    assert fluid.transpiler.ServerRuntimeConfig is ServerRuntimeConfig
