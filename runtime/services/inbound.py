"""What a pserver lets in: the largest message its trainers can legitimately send it, and the
bytes of inbound messages it holds at once, derived from its program.

A trainer sends a pserver the vars of its `listen_and_serv` contract (`ServeContract.received`):
every var no one trainer owns, and its own copies (`trainer_copies`: sync mode's per-trainer grad
blocks), all in one bundled SEND at most; and, where the pserver holds a distributed table or
serves rows by id (remote sparse update), PREFETCH messages of ids. Every other message is a
header alone. So the largest legitimate message is a header (`HEADER_ALLOWANCE`: `decode`
refuses a bigger one) plus the larger of the biggest trainer's SEND and one PREFETCH's ids, and
the largest legitimate frame is the header or one var's largest frame. Sizes come from the
declared vars:

- a dense var: its declared shape times its dtype's size; with ``transpiler.compression`` a
  float var may come packed instead, which top-k makes bigger than the tensor (indices and
  values): the larger of the two counts;
- a dim a program leaves open (-1) holds one example per row of the trainer's batch
  (``data.batch_size``), or, in a LoD var (a sequence per example), `ROWS_PER_EXAMPLE`;
- a sparse var (SELECTED_ROWS): its rows (int64) and values, as many rows as a batch looks up
  (`ROWS_PER_EXAMPLE` per example); a geo delta instead holds each row of the var at most once
  (the rows that changed since the last push), so as many as its declared height;
- prefetch ids: as many as a batch looks up, each in the ids var's dtype (int64 for remote
  sparse update).

The budget (`InboundLimits.budget`) is `BUDGET_MESSAGES` largest messages, at least
`BUDGET_FLOOR`: what the transport's inbox holds before it stops reading (its
``inbox_bytes``), each connection then holding what libzmq queued (``RCVHWM`` messages, plus
the frame its decoder is reading) until TCP pushes back on the sender. `recv_hwm` is chosen so
that the job's trainers' connections together queue about one budget more, one message each
at the least.

DESIGN: what bounds what, in libzmq (4.3), measured (benchmarks/inbound_memory.py): its TCP
decoder reads a frame's size from its header and refuses one over ``MAXMSGSIZE`` by dropping
the connection before allocating anything, else allocates the whole frame at once (under
CurveZMQ the encrypted frame, then its plaintext); ``RCVHWM`` counts whole messages, not
frames. So a frame over the limit costs nothing, and a connection holds at most ``RCVHWM``
messages. What libzmq does not bound is a message's frame count: it queues every frame of a
message until the last one arrives, and only then can the application read the first, so a
peer whose frames each stay under the limit can still make one message as big as it likes.
The transport drops such a message once it is whole (``max_message_size``), which is after
libzmq held all of it; SECURITY.md says so.

DESIGN: `ROWS_PER_EXAMPLE` is a bound, not a measurement: a pserver reads no data, so it cannot
know the longest sequence the trainers' data holds. pslab's own data sets look up at most 20
ids per example in one table (ctr: 2 slots of up to 10); 1,024 leaves room for long text while
keeping a sparse model's budget in megabytes. A legitimate message over the bound would be
dropped, so a data set with longer sequences needs it raised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from transpiler.distribute.config import DistributedMode, compression_settings
from transpiler.distribute.contract import ServeContract
from transpiler.ir import Program, Var, VarType

from runtime.execution.table import TableShard, remote_tables
from runtime.network.compression import FLOAT_DTYPES, Codec, index_dtype, packed_nbytes, topk_count
from runtime.network.wire import DEFAULT_MAX_HEADER_SIZE, ROWS_DTYPE
from runtime.network.zmq_transport import ZmqLimits
from runtime.services.job import Job

MiB = 1 << 20
HEADER_ALLOWANCE = DEFAULT_MAX_HEADER_SIZE
"""Bytes of a message's header frame counted in the largest message: the most `decode` reads."""
ROWS_PER_EXAMPLE = 1024
"""Rows one example may put in an open (-1) dim of a LoD var, or in a sparse var or prefetch
ids (over all its lookups of one table): see the module's DESIGN note."""
BUDGET_MESSAGES = 4
"""Largest messages the inbound budget holds: one being handled and a few waiting."""
BUDGET_FLOOR = 8 * MiB
"""The least inbound budget: small models' messages are headers mostly."""
MAX_RECV_HWM = 16
"""The most messages libzmq queues per connection, however small the messages."""
CURVE_FRAME_OVERHEAD = 64
"""Bytes ``MAXMSGSIZE`` allows beyond the largest frame: CurveZMQ carries each frame in a
MESSAGE command 33 bytes longer (measured), which is what libzmq's limit counts."""


@dataclass(frozen=True)
class InboundLimits:
    """What one pserver accepts from its trainers (see the module)."""

    largest_message: int
    """Bytes of the largest message a trainer legitimately sends it (all its frames)."""
    largest_frame: int
    """Bytes of the largest frame of such a message."""
    budget: int
    """Bytes of received messages held for the pserver before its transport stops reading."""
    recv_hwm: int
    """Messages libzmq queues per connection before it stops reading that connection."""

    def zmq_limits(self, linger_ms: int = 100) -> ZmqLimits:
        """The pserver transport's `ZmqLimits`."""
        return ZmqLimits(recv_hwm=self.recv_hwm,
                         max_frame_size=self.largest_frame + CURVE_FRAME_OVERHEAD,
                         max_message_size=self.largest_message, inbox_bytes=self.budget,
                         linger_ms=linger_ms)


def inbound_limits(job: Job, program: Program) -> InboundLimits:
    """The limits of the pserver of `job` that serves `program` (its main program)."""
    frames = _Frames(job, ServeContract.of(program))
    data = max(frames.largest_send(program), frames.largest_prefetch(program))
    largest = HEADER_ALLOWANCE + data
    budget = max(BUDGET_FLOOR, BUDGET_MESSAGES * largest)
    hwm = min(MAX_RECV_HWM, max(1, budget // (max(1, job.trainers) * largest)))
    return InboundLimits(largest, max(HEADER_ALLOWANCE, frames.largest_frame), budget, hwm)


def pserver_inbound_limits(job: Job, index: int) -> InboundLimits:
    """`inbound_limits` of pserver `index` of `job` (its program built here)."""
    return inbound_limits(job, job.pserver_programs(index)[0])


class _Frames:
    """The bytes of the frames a trainer may send for each var, and the largest one seen."""

    def __init__(self, job: Job, contract: ServeContract) -> None:
        self.contract = contract
        self.batch = job.scenario.data.batch_size
        self.geo = contract.mode is DistributedMode.GEO
        method, self.ratio = compression_settings(job.args.config)
        self.codec = None if method == "none" else Codec(method)
        self.largest_frame = 0

    def largest_send(self, program: Program) -> int:
        """Data bytes of the largest SEND one trainer makes: the vars every trainer may send,
        and the biggest trainer's own copies."""
        block = program.global_block()
        copies = self.contract.trainer_copies
        shared = self._total(block.var(name) for name in self.contract.received
                             if name not in copies)
        own: dict[int, int] = {}
        for name, trainer in copies.items():
            own[trainer] = own.get(trainer, 0) + self._total([block.var(name)])
        return shared + max(own.values(), default=0)

    def largest_prefetch(self, program: Program) -> int:
        """Data bytes of the largest PREFETCH: one ids var of the distributed table, or the
        ids of a remote sparse update's rows."""
        block, op = program.global_block(), self.contract.op
        table = TableShard.of(program, op)
        ids = [self._var_frames(block.var(name)) for name in table.prefetch] if table else []
        if remote_tables(program, op):
            ids.append(self._note([self.rows(lod=True) * ROWS_DTYPE.itemsize]))
        return max((sum(frames) for frames in ids), default=0)

    def rows(self, lod: bool) -> int:
        """Rows a batch puts in an open dim: one per example, `ROWS_PER_EXAMPLE` in a LoD var."""
        return self.batch * (ROWS_PER_EXAMPLE if lod else 1)

    def _total(self, variables: Iterable[Var]) -> int:
        return sum(sum(self._var_frames(var)) for var in variables)

    def _var_frames(self, var: Var) -> list[int]:
        """The bytes of each frame of the largest value of `var` a trainer may send."""
        itemsize = np.dtype(var.dtype).itemsize
        if var.type is VarType.SELECTED_ROWS:
            rows = var.shape[0] if self.geo else self.rows(lod=True)
            width = math.prod(var.shape[1:])
            return self._note([rows * ROWS_DTYPE.itemsize, rows * width * itemsize])
        count = math.prod(self.rows(var.lod_level > 0) if d < 0 else d for d in var.shape)
        frames = [count * itemsize]
        if self.codec is not None and np.dtype(var.dtype) in FLOAT_DTYPES:
            frames = max(frames, self._packed(count, np.dtype(var.dtype)), key=sum)
        return self._note(frames)

    def _packed(self, count: int, dtype: np.dtype) -> list[int]:
        """The frames of `count` values of `dtype` packed by the job's codec."""
        assert self.codec is not None
        if self.codec is Codec.TOPK:
            kept = topk_count(count, self.ratio)
            return [kept * index_dtype(count).itemsize, kept * dtype.itemsize]
        if self.codec is Codec.INT8:
            return [dtype.itemsize, count]
        return [packed_nbytes(self.codec, count, dtype, None)]

    def _note(self, frames: list[int]) -> list[int]:
        self.largest_frame = max(self.largest_frame, *frames)
        return frames
