"""Which failures of a node deserve their traceback in its log.

A node that fails ends with one line, ``<node> failed: <error>`` (`runtime.services.node`). The
traceback above it helps with a bug, and only hides the line for what is not one: a failure
the scenario expects (``expect.error``, as a fault the job cannot survive), or a condition of
the job whose message already says what happened, where and since when: a timeout (a request
unanswered, no pserver listening, the deadline), the transport failing, a peer's refusal, a
node unable to do its part. ``--debug`` (``PSLAB_DEBUG=1``, `runtime.config.commandline`) logs
every traceback.
"""

from __future__ import annotations

from runtime.config import expect
from runtime.config.commandline import debugging
from runtime.config.scenario import Scenario
from runtime.network.transport import TransportError
from runtime.network.wire import RemoteError

__all__ = ["JOB_CONDITIONS", "traceback_wanted"]

JOB_CONDITIONS: tuple[type[BaseException], ...] = (TimeoutError, TransportError, RemoteError)
"""Failures of a job, not of pslab's code: their message is the whole story."""


def traceback_wanted(scenario: Scenario, error: BaseException,
                     conditions: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether `error`, which ended a node of `scenario`, is logged with its traceback:
    always with ``--debug``; never when the scenario expects it, nor for `JOB_CONDITIONS` and
    the caller's own `conditions`."""
    if debugging():
        return True
    verdict = expect.outcome(scenario, error)
    if verdict is not None and verdict.passed:
        return False
    return not isinstance(error, JOB_CONDITIONS + conditions)
