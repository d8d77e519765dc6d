"""nccl2 and collective modes: every trainer holds every parameter and trainers talk to each
other, not to pservers (docs/transpiler.md §8). Both only add ops to copies of the programs.

**nccl2**: the startup gets RAW vars ``NCCLID`` (``NCCLID_{i}`` for more rings, and the
hierarchical ``Hierarchical_inter_NCCLID_{i}`` / ``Hierarchical_exter_NCCLID_{i}``) and, last,
`gen_nccl_id` (attrs ``trainers``, ``trainer_id``, ``endpoint``, ``nccl_comm_num``,
``use_hierarchical_allreduce``, ``hierarchical_allreduce_inter_nranks``): trainer 0 makes the
communicator ids and sends them to the others. The main program is the original one with the
attributes ``_trainers_endpoints``, ``_nccl_comm_num``, ``_use_hierarchical_allreduce`` (and
``_hierarchical_allreduce_inter_nranks``): as in Paddle, the executor that runs it all-reduces
the grads; use collective mode for programs that carry their all-reduce ops. pslab's runtime
runs `nccl2_executable(main)`: the program with the ops such an executor would run, those of
``grad_allreduce`` (below).

**collective**, ops a runtime executes (ranks are the trainers, ``nranks`` of them; ``ring_id``
picks one of ``nccl_comm_num`` communicators, used in turn):

- ``c_gen_nccl_id`` (startup; Out a RAW id var; attrs ``rank``, ``endpoint``,
  ``other_endpoints``, ``ring_id``): rank 0 creates the ring's communicator id, the others
  receive it from rank 0.
- ``c_comm_init`` (startup; X the id var; attrs ``nranks``, ``rank``, ``ring_id``): join the ring.
- ``c_broadcast`` (startup; X = Out = a parameter; attrs ``ring_id``, ``root`` 0): every rank
  takes rank 0's value, so all start equal.
- ``c_allreduce_sum`` (X = Out, in place; attrs ``ring_id``, ``nranks``): every rank's X
  becomes the element-wise sum of all ranks' X (a SELECTED_ROWS X: the rows of all ranks,
  concatenated). It blocks until all ranks have contributed.

- ``c_comm_init_all`` (startup; attr ``ring_id`` 0): open ring 0 over the devices of this
  process only (``single_process_multi_thread``).

``grad_allreduce``: the loss grad is scaled by 1/nranks right after it is filled, and each
parameter's grad is `c_allreduce_sum`-ed right after the op that finally writes it, so every
rank's optimizer sees the mean grad. ``local_sgd``: ranks train alone; every
``local_sgd_k_steps`` steps (every step when 1) each parameter is replaced by the ranks' mean:
``p = snap - p`` (`elementwise_sub`), `c_allreduce_sum`, ``scale`` 1/nranks, ``p = snap - p``,
``snap = p`` (`assign`), where ``<param>@SNAPSHOT`` holds the last common value (filled by the
startup after the broadcast).
``single_process_multi_thread``: the original's `SingleProcessMultiThread(GradAllReduce)`, whose
one process drives several devices: grad_allreduce's main program on one ring (ring 0, whatever
``nccl_comm_num`` says), ``nranks`` the number of endpoints (one is allowed), and a startup with
only ``c_comm_init_all`` added: no id exchange and no parameter broadcast, as the process's
devices start from the same values. It never connects processes; pslab's runtime, one device
per trainer process, runs it with one trainer (docs/transpiler.md §8).
"""

from __future__ import annotations

from ..ir import Block, OpRole, Program, VarType
from .analysis import read_optimize_section
from .cluster import Cluster
from .config import SINGLE_PROCESS_MULTI_THREAD as SINGLE_PROCESS
from .config import DistributeTranspilerConfig
from .edit import append_every_k_steps

SNAPSHOT = "@SNAPSHOT"
LOCAL_SGD_STEP = "@LOCAL_SGD_STEP@"


def transpile_nccl2(config: DistributeTranspilerConfig, cluster: Cluster, main: Program,
                    startup: Program) -> None:
    """Add the NCCL id exchange to `startup` and the job's attributes to `main`."""
    nranks, inter = cluster.trainers, config.hierarchical_allreduce_inter_nranks
    if config.use_hierarchical_allreduce and (nranks <= inter or nranks % inter):
        raise ValueError(f"trainers: {nranks} trainers cannot be grouped in nodes of "
                         f"hierarchical_allreduce_inter_nranks={inter}")
    main.attrs.update({"_trainers_endpoints": list(cluster.trainer_endpoints),
                       "_nccl_comm_num": config.nccl_comm_num,
                       "_use_hierarchical_allreduce": config.use_hierarchical_allreduce})
    if config.use_hierarchical_allreduce:
        main.attrs["_hierarchical_allreduce_inter_nranks"] = inter
    block = startup.global_block()
    ids = ["NCCLID"] + [f"NCCLID_{i}" for i in range(1, config.nccl_comm_num)]
    hierarchical = {"InterNCCLID": [], "ExterNCCLID": []} if not config.use_hierarchical_allreduce \
        else {"InterNCCLID": [f"Hierarchical_inter_NCCLID_{i}" for i in range(config.nccl_comm_num)],
              "ExterNCCLID": [f"Hierarchical_exter_NCCLID_{i}" for i in range(config.nccl_comm_num)]}
    for name in ids + hierarchical["InterNCCLID"] + hierarchical["ExterNCCLID"]:
        block.create_var(name, type=VarType.RAW, persistable=True)
    block.append_op("gen_nccl_id", {}, {"NCCLID": ids, **hierarchical},
                    {"trainers": list(cluster.trainer_endpoints), "trainer_id": cluster.trainer_id,
                     "endpoint": cluster.current_endpoint, "nccl_comm_num": config.nccl_comm_num,
                     "use_hierarchical_allreduce": config.use_hierarchical_allreduce,
                     "hierarchical_allreduce_inter_nranks": inter})


def nccl2_executable(main: Program) -> Program:
    """What Paddle's executor runs for an nccl2 trainer program: a copy with the loss grad
    scaled by 1/nranks and each parameter's grad all-reduced on the ``_nccl_comm_num`` rings
    in turn, as collective mode's ``grad_allreduce`` writes them."""
    nranks = len(main.attrs["_trainers_endpoints"])
    program = main.clone()
    _scale_loss_grad(program.global_block(), nranks)
    _allreduce_grads(program.global_block(), nranks, int(main.attrs.get("_nccl_comm_num", 1)))
    return program


def transpile_collective(config: DistributeTranspilerConfig, cluster: Cluster, main: Program,
                         startup: Program) -> None:
    """Add communicator setup (and parameter broadcast) to `startup`, and grad all-reduce or
    local-SGD averaging to `main`."""
    section = read_optimize_section(main)
    params = [pg.param for pg in section.params_grads]
    rings = 1 if config.collective_mode == SINGLE_PROCESS else config.nccl_comm_num
    if config.collective_mode == SINGLE_PROCESS:
        startup.global_block().append_op("c_comm_init_all", {}, {}, {"ring_id": 0})
    else:
        _init_communicators(startup, cluster, rings)
        _broadcast(startup, params, rings)
    main.attrs.update({"_trainers_endpoints": list(cluster.trainer_endpoints),
                       "_nccl_comm_num": rings,
                       "_collective_mode": config.collective_mode})
    if config.collective_mode in ("grad_allreduce", SINGLE_PROCESS):
        _scale_loss_grad(main.global_block(), cluster.trainers)
        _allreduce_grads(main.global_block(), cluster.trainers, rings)
    else:
        _local_sgd(main, startup, params, cluster.trainers, config)


def _init_communicators(startup: Program, cluster: Cluster, rings: int) -> None:
    block = startup.global_block()
    others = [e for e in cluster.trainer_endpoints if e != cluster.current_endpoint]
    for ring in range(rings):
        nccl_id = f"nccl_id_{ring}"
        block.create_var(nccl_id, type=VarType.RAW, persistable=True)
        block.append_op("c_gen_nccl_id", {}, {"Out": [nccl_id]},
                        {"rank": cluster.trainer_id, "endpoint": cluster.current_endpoint,
                         "other_endpoints": others, "ring_id": ring})
        block.append_op("c_comm_init", {"X": [nccl_id]}, {},
                        {"nranks": cluster.trainers, "rank": cluster.trainer_id, "ring_id": ring})


def _broadcast(startup: Program, params: list[str], rings: int) -> None:
    block = startup.global_block()
    for n, param in enumerate(params):
        block.append_op("c_broadcast", {"X": [param]}, {"Out": [param]},
                        {"ring_id": n % rings, "root": 0})


def _scale_loss_grad(block: Block, nranks: int) -> None:
    loss_grad_role = int(OpRole.Backward | OpRole.Loss)
    index = next((i for i, op in enumerate(block.ops) if op.role == loss_grad_role), None)
    if index is None:
        raise ValueError("program: no loss-grad op (role Backward|Loss) to scale; "
                         "build it with optimizer.minimize")
    loss_grad = block.ops[index].output_arg_names[0]
    block.insert_op(index + 1, "scale", {"X": [loss_grad]}, {"Out": [loss_grad]},
                    {"scale": 1.0 / nranks, "bias": 0.0, "bias_after_scale": True,
                     "op_role": int(OpRole.Backward)})


def _allreduce_grads(block: Block, nranks: int, rings: int) -> None:
    """A c_allreduce_sum after each backward op that finally writes parameter grads."""
    ring = 0
    for index in range(len(block.ops) - 1, -1, -1):
        op = block.ops[index]
        if not op.role & OpRole.Backward or not op.role_var:
            continue
        for grad in op.role_var[1::2]:
            block.insert_op(index + 1, "c_allreduce_sum", {"X": [grad]}, {"Out": [grad]},
                            {"ring_id": ring, "nranks": nranks, "op_role": int(OpRole.Backward)})
            ring = (ring + 1) % rings


def _local_sgd(main: Program, startup: Program, params: list[str], nranks: int,
               config: DistributeTranspilerConfig) -> None:
    for prog in (main, startup):
        for param in params:
            var = main.global_block().var(param)
            prog.global_block().create_var(param + SNAPSHOT, shape=var.shape, dtype=var.dtype,
                                           persistable=True, stop_gradient=True)
    for param in params:
        startup.global_block().append_op("assign", {"X": [param]}, {"Out": [param + SNAPSHOT]})

    def average(block: Block) -> None:
        role = {"op_role": int(OpRole.Optimize)}
        for n, param in enumerate(params):
            snap = param + SNAPSHOT
            block.append_op("elementwise_sub", {"X": [snap], "Y": [param]}, {"Out": [param]},
                            {"axis": -1, **role})
            block.append_op("c_allreduce_sum", {"X": [param]}, {"Out": [param]},
                            {"ring_id": n % config.nccl_comm_num, "nranks": nranks, **role})
            block.append_op("scale", {"X": [param]}, {"Out": [param]},
                            {"scale": 1.0 / nranks, "bias": 0.0, "bias_after_scale": True, **role})
            block.append_op("elementwise_sub", {"X": [snap], "Y": [param]}, {"Out": [param]},
                            {"axis": -1, **role})
            block.append_op("assign", {"X": [param]}, {"Out": [snap]}, dict(role))

    if config.local_sgd_k_steps == 1:
        average(main.global_block())
    else:
        append_every_k_steps(main, startup, LOCAL_SGD_STEP, config.local_sgd_k_steps, average,
                             OpRole.Optimize)
