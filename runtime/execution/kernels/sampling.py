"""The negative samples of `nce` (Paddle's noise-contrastive estimation), shared by the numpy and
torch kernels and by the trainer that prefetches the rows they read.

Each row i of Label ([N, num_true] int64) gets ``num_neg_samples`` negatives after its true
classes: SampleLabels is ``[N, num_true + num_neg_samples]``. The samplers are Paddle's
(``math/sampler.cc``), over ``range = num_total_classes - 1``:

- 0 uniform: ``floor(u * num_total_classes)``, q(c) = 1 / num_total_classes;
- 1 log-uniform: ``(int(exp(u * log(num_total_classes))) - 1) % range``,
  q(c) = log((c + 2) / (c + 1)) / log(num_total_classes) (the ``% range`` is Paddle's: class
  ``range`` itself is never drawn);
- 2 custom: Walker's alias method over CustomDistProbs / CustomDistAlias / CustomDistAliasProbs:
  index ``floor(u * num_total_classes)``, kept if a second draw ``p <= AliasProbs[index]``, else
  ``Alias[index]`` (an alias of -1 keeps the index); q(c) = CustomDistProbs[c].

``custom_neg_classes`` (Paddle's attribute for tests) gives every row those negatives instead.

DESIGN: the draws are counter-based, not a stream. Paddle re-seeds its engine on every run, so a
nonzero ``seed`` gives the same negatives every step (and seed 0 fresh random ones). pslab's
negatives of row i are a hash (splitmix64) of the seed (the attribute, or the program's random
seed when it is 0), the step (the optional input ``Step``, a counter the `nce` layer raises
once per step; 0 without it) and row i's true labels. So they change from step to step, are
reproducible, are the same in both backends, and do not depend on where in the batch the row
sits: a trainer holding half of a global batch draws for each row what local training on the
whole batch draws, which is what makes sync training equal local training. Two rows with the
same labels in one step share their negatives (Paddle draws them independently).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.execution.kernels.context import KernelContext
from runtime.execution.tensor import host_value, to_dense

SAMPLERS = {0: "uniform", 1: "log_uniform", 2: "custom_dist"}
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _host(value: object) -> np.ndarray:
    """A value of either backend as a dense numpy array."""
    return np.asarray(to_dense(host_value(value)))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (x + _GOLDEN).astype(np.uint64)
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _units(labels: np.ndarray, key: int, draws: int) -> np.ndarray:
    """[N, draws] uniforms in [0, 1), a function of the key and each row's labels only."""
    h = _mix(np.full(labels.shape[0], key, np.uint64))
    for t in range(labels.shape[1]):
        h = _mix(h ^ labels[:, t].astype(np.uint64))
    with np.errstate(over="ignore"):
        counters = np.arange(1, draws + 1, dtype=np.uint64) * _GOLDEN
        bits = _mix(h[:, None] ^ counters[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class Sampler:
    """One of Paddle's samplers over ``classes`` classes (see the module docstring)."""

    kind: int
    classes: int
    probs: np.ndarray | None = None
    alias: np.ndarray | None = None
    alias_probs: np.ndarray | None = None

    @property
    def draws_per_sample(self) -> int:
        return 2 if self.kind == 2 else 1

    def draw(self, u: np.ndarray) -> np.ndarray:
        """Classes for uniforms `u` ([N, k * draws_per_sample]) as [N, k] int64."""
        if self.kind == 0:
            return np.minimum(np.floor(u * self.classes), self.classes - 1).astype(np.int64)
        if self.kind == 1:
            value = np.exp(u * np.log(self.classes)).astype(np.int64) - 1
            return value % (self.classes - 1)
        assert self.alias is not None and self.alias_probs is not None
        index = np.minimum(np.floor(u[:, 0::2] * self.classes), self.classes - 1).astype(np.int64)
        alias = self.alias[index]
        swap = (u[:, 1::2] > self.alias_probs[index]) & (alias != -1)
        return np.where(swap, alias, index).astype(np.int64)

    def probability(self, classes: np.ndarray) -> np.ndarray:
        """q(c) of each class, float64, shaped like `classes`."""
        if self.kind == 0:
            return np.full(classes.shape, 1.0 / self.classes)
        if self.kind == 1:
            c = classes.astype(np.float64)
            return np.log((c + 2.0) / (c + 1.0)) / np.log(self.classes)
        assert self.probs is not None
        return self.probs[classes].astype(np.float64)


def sampler_of(ctx: KernelContext) -> Sampler:
    """The sampler of an `nce` or `nce_grad` op (``sampler``, ``num_total_classes``)."""
    kind, classes = int(ctx.attr("sampler", 0)), int(ctx.attr("num_total_classes"))
    if kind not in SAMPLERS:
        raise ValueError(f"nce: sampler {kind} is not one of {SAMPLERS}")
    if classes < 2:
        raise ValueError(f"nce: num_total_classes {classes} must be at least 2")
    if kind != 2:
        return Sampler(kind, classes)
    tables = [ctx.input(slot) for slot in ("CustomDistProbs", "CustomDistAlias",
                                           "CustomDistAliasProbs")]
    if any(t is None for t in tables):
        raise ValueError("nce: sampler 2 (custom_dist) needs CustomDistProbs, CustomDistAlias "
                         "and CustomDistAliasProbs")
    probs, alias, alias_probs = (_host(t).reshape(-1) for t in tables)
    for name, t in (("CustomDistProbs", probs), ("CustomDistAlias", alias),
                    ("CustomDistAliasProbs", alias_probs)):
        if t.size != classes:
            raise ValueError(f"nce: {name} holds {t.size} values, not num_total_classes {classes}")
    return Sampler(2, classes, probs, alias.astype(np.int64), alias_probs)


def sample_key(ctx: KernelContext) -> int:
    """The draws' key: the ``seed`` attribute (the program's random seed when 0) and the
    ``Step`` input (0 without one)."""
    seed = int(ctx.attr("seed", 0)) or ctx.random_seed
    step_value = ctx.input("Step")
    step = 0 if step_value is None else int(_host(step_value).reshape(-1)[0])
    return (seed * 1_000_003 + step) & 0xFFFFFFFFFFFFFFFF


def true_labels(ctx: KernelContext, rows: int | None = None) -> np.ndarray:
    """Label as [N, num_true] int64 ids, checked against num_total_classes."""
    label = _host(ctx.input("Label"))
    if not np.issubdtype(label.dtype, np.integer):
        raise TypeError(f"nce: Label must hold int64 class ids, got {label.dtype}")
    n = label.shape[0] if rows is None else rows
    ids = label.reshape(n, -1).astype(np.int64)
    classes = int(ctx.attr("num_total_classes"))
    if ids.size and (ids.min() < 0 or ids.max() >= classes):
        raise IndexError(f"nce: Label ids {ids.min()}..{ids.max()} outside num_total_classes "
                         f"{classes}")
    return ids


def sample_labels(ctx: KernelContext) -> np.ndarray:
    """SampleLabels: each row's true labels, then its negatives ([N, num_true + num_neg])."""
    labels = true_labels(ctx)
    fixed = list(ctx.attr("custom_neg_classes", []) or [])
    if fixed:
        if len(fixed) != int(ctx.attr("num_neg_samples", 10)):
            raise ValueError(f"nce: custom_neg_classes {fixed} are not num_neg_samples "
                             f"{ctx.attr('num_neg_samples', 10)} classes")
        negatives = np.tile(np.asarray(fixed, np.int64), (labels.shape[0], 1))
    else:
        sampler = sampler_of(ctx)
        k = int(ctx.attr("num_neg_samples", 10))
        u = _units(labels, sample_key(ctx), k * sampler.draws_per_sample)
        negatives = sampler.draw(u)
    return np.concatenate([labels, negatives], axis=1)


__all__ = ["SAMPLERS", "Sampler", "sample_key", "sample_labels", "sampler_of",
           "true_labels"]
