"""The distribute transpiler: one training program in, the programs of every role out.

A straight pipeline of small passes (see `transpiler.DistributeTranspiler`): read the optimize
section (`analysis`), cut vars in blocks (`slicing`, `plan.slice_pass`), place them
(`dispatch`, `plan.dispatch_pass`), rewrite the trainer (`trainer`, `lookup_table`), build each
pserver (`pserver`) and the startups (`startup`), and write the trainer programs' RPC plan
(`rpc_plan`, read back by `contract.TrainContract`); `geo` and `collective` hold the other modes.
"""

from .checkpoint import CheckpointConfig, append_checkpoint_notify
from .config import DistributedMode, DistributeTranspilerConfig, ServerRuntimeConfig
from .dispatch import HashName, PSDispatcher, RoundRobin
from .slicing import VarBlock, slice_variable
from .transpiler import DistributeTranspiler, GeoSgdTranspiler

__all__ = [
    "CheckpointConfig", "DistributeTranspiler", "DistributeTranspilerConfig", "DistributedMode", "GeoSgdTranspiler",
    "HashName", "PSDispatcher", "RoundRobin", "ServerRuntimeConfig", "VarBlock", "append_checkpoint_notify",
    "slice_variable",
]
