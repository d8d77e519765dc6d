"""Seeded data sets for the ready-made models, served as feed dicts in (sharded) batches.

A `Dataset` is a fixed table of examples held column by column: a dense column is one array with
a row per example; a ragged column (LoD ids) is a flat array of values plus per-example offsets.
Examples are visited in an endless stream of epochs, each a permutation drawn from the seed and
the epoch number, so the same seed gives the same batches and every epoch is shuffled anew.

Step ``s`` of a run with ``trainers`` trainers of ``batch_size`` examples each reads the global
batch of stream positions ``[s*G, (s+1)*G)`` with ``G = batch_size * trainers``; trainer ``i``'s
`Shard` takes the ``i``-th contiguous slice of it. The shards of one step, joined in trainer
order, are exactly the global batch a single process would train on, which is what lets
sync-mode distributed training be compared with local training.

Generators: `synthetic_regression` (linear), `synthetic_classification` (mlp: separable gaussian
blobs), `ctr` (Zipf-distributed ids in LoD sequences of random lengths, labels that depend on the
ids), `skipgram` ((center, context, negatives) from a synthetic Zipf corpus with topics) and
`digits` (scikit-learn's bundled 8x8 digits, with the ``[data]`` extra).

Timing mode feeds `phantom_batch` instead: the shapes of a batch without its values.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from transpiler.models import Model

from runtime.execution.tensor import Phantom

Feed = dict[str, Any]


class DataError(ValueError):
    """A data set that cannot be made or does not fit a model; the message names the culprit."""


@dataclass(frozen=True)
class Dense:
    """One row per example: ``values[i]`` is example ``i``."""

    values: np.ndarray

    def __len__(self) -> int:
        return len(self.values)

    def take(self, idx: np.ndarray) -> np.ndarray:
        return self.values[idx]


@dataclass(frozen=True)
class Ragged:
    """A sequence per example: ``values[offsets[i]:offsets[i + 1]]`` is example ``i``."""

    values: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        off = self.offsets
        if off.ndim != 1 or off[0] != 0 or off[-1] != len(self.values) or np.any(np.diff(off) < 0):
            raise DataError("ragged column: offsets must rise from 0 to the number of values")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
        """The values of the chosen sequences, in order, and their one-level LoD offsets."""
        starts, lengths = self.offsets[idx], np.diff(self.offsets)[idx]
        new_offsets = np.concatenate([[0], np.cumsum(lengths)])
        pos = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
        return self.values[pos], [new_offsets.tolist()]


Column = Dense | Ragged


class Dataset:
    """A named table of examples, read in seeded, reshuffled epochs."""

    def __init__(self, name: str, columns: Mapping[str, Column], seed: int = 0) -> None:
        sizes = {key: len(col) for key, col in columns.items()}
        if not sizes or len(set(sizes.values())) != 1:
            raise DataError(f"dataset {name!r}: columns must have one common length, got {sizes}")
        self.name, self.columns, self.seed = name, dict(columns), int(seed)
        self.size = next(iter(sizes.values()))
        self._orders: dict[int, np.ndarray] = {}
        """The latest epochs' orders (`ORDERS_KEPT`), read-only."""

    @property
    def fields(self) -> list[str]:
        return list(self.columns)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The permutation of example indices that epoch `epoch` visits (read-only).

        DESIGN: kept for the latest `ORDERS_KEPT` epochs: drawing it (a seeded generator and a
        shuffle of the whole set) cost a training step more than a small model's kernels, and
        every step of the epoch reads it again; trainers sharing a data set in one process may
        be an epoch apart."""
        order = self._orders.get(epoch)
        if order is None:
            order = epoch_permutation(self.seed, epoch, self.size)
            order.setflags(write=False)
            if len(self._orders) >= ORDERS_KEPT:
                del self._orders[min(self._orders)]
            self._orders[epoch] = order
        return order

    def positions(self, start: int, count: int) -> np.ndarray:
        """Example indices at stream positions ``[start, start + count)``."""
        parts, pos = [], start
        while pos < start + count:
            epoch, offset = divmod(pos, self.size)
            take = min(self.size - offset, start + count - pos)
            parts.append(self.epoch_order(epoch)[offset:offset + take])
            pos += take
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def feed(self, idx: np.ndarray, feeds: Sequence[str] | None = None) -> Feed:
        """Feed dict of examples `idx`: an array per dense field, ``(values, lod)`` per ragged."""
        names = self.fields if feeds is None else list(feeds)
        missing = [n for n in names if n not in self.columns]
        if missing:
            raise DataError(f"dataset {self.name!r} has no field {missing[0]!r}; "
                            f"it provides {self.fields}")
        return {n: self.columns[n].take(idx) for n in names}

    def phantom_batch(self, batch_size: int, feeds: Sequence[str] | None = None) -> dict[str, Phantom]:
        """Timing mode's batch: a phantom per field, shaped like a batch of `batch_size`
        examples. Every sequence of a ragged field gets the field's mean length, rounded up, so
        the batch holds about as many values as a real one (and its LoD as many sequences)."""
        names = self.fields if feeds is None else list(feeds)
        return {name: _phantom_column(self.columns[name], batch_size) for name in names}

    def shard(self, trainer_id: int, trainers: int) -> "Shard":
        if trainers < 1 or not 0 <= trainer_id < trainers:
            raise DataError(f"shard: trainer_id {trainer_id} is not in [0, trainers={trainers})")
        return Shard(self, trainer_id, trainers)

    def batch(self, step: int, batch_size: int, feeds: Sequence[str] | None = None) -> Feed:
        """The whole (unsharded) batch of `step`."""
        return self.shard(0, 1).batch(step, batch_size, feeds)

    def check_model(self, model: Model) -> None:
        """Raise `DataError` unless every feed of `model` is a field of matching dtype and shape."""
        block = model.main.global_block()
        for name in model.feeds:
            var = block.var(name)
            col = self.columns.get(name)
            if col is None:
                raise DataError(f"dataset {self.name!r} has no field {name!r} that model "
                                f"{model.name!r} feeds; it provides {self.fields}")
            values = col.values
            if str(values.dtype) != var.dtype or tuple(values.shape[1:]) != tuple(var.shape[1:]):
                rows = "rows" if isinstance(col, Dense) else "ragged rows"
                raise DataError(f"dataset {self.name!r} field {name!r} has {rows} of "
                                f"{values.dtype}{list(values.shape[1:])}, but model "
                                f"{model.name!r} expects {var.dtype}{list(var.shape[1:])}")
            if isinstance(col, Ragged) != (var.lod_level > 0):
                raise DataError(f"dataset {self.name!r} field {name!r}: model {model.name!r} "
                                f"expects lod_level {var.lod_level}")


ORDERS_KEPT = 2
"""Epoch orders a `Dataset` keeps (`Dataset.epoch_order`)."""


def epoch_permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    """The order in which epoch `epoch` of a shuffled data set of `size` examples visits them."""
    return np.random.default_rng([seed, 1, epoch]).permutation(size)


def stream_start(step: int, batch_size: int, trainer_id: int, trainers: int) -> int:
    """The first stream position of trainer `trainer_id`'s shard of `step`'s global batch:
    the global batch is positions ``[step*G, (step+1)*G)``, ``G = batch_size * trainers``."""
    if batch_size < 1:
        raise DataError(f"batch_size must be positive, got {batch_size}")
    if step < 0:
        raise DataError(f"step must be non-negative, got {step}")
    return (step * trainers + trainer_id) * batch_size


@dataclass(frozen=True)
class Shard:
    """Trainer `trainer_id`'s slice of every global batch."""

    dataset: Dataset
    trainer_id: int
    trainers: int

    def indices(self, step: int, batch_size: int) -> np.ndarray:
        start = stream_start(step, batch_size, self.trainer_id, self.trainers)
        return self.dataset.positions(start, batch_size)

    def batch(self, step: int, batch_size: int, feeds: Sequence[str] | None = None) -> Feed:
        return self.dataset.feed(self.indices(step, batch_size), feeds)

    def batches(self, batch_size: int, steps: int, feeds: Sequence[str] | None = None,
                start: int = 0) -> Iterator[Feed]:
        for step in range(start, start + steps):
            yield self.batch(step, batch_size, feeds)


def _phantom_column(column: Column, batch_size: int) -> Phantom:
    values = column.values
    if isinstance(column, Dense):
        return Phantom((batch_size,) + values.shape[1:], values.dtype)
    length = math.ceil(len(values) / len(column))
    lod = (tuple(k * length for k in range(batch_size + 1)),)
    return Phantom((batch_size * length,) + values.shape[1:], values.dtype, lod=lod)


# -- generators -----------------------------------------------------------------------------------

def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, 0])


def _labels(values: np.ndarray) -> Dense:
    return Dense(values.astype(np.int64).reshape(-1, 1))


def synthetic_regression(seed: int = 0, size: int = 2048, dim: int = 13,
                         noise: float = 0.1) -> Dataset:
    """``y = x @ w + b + noise`` with standard normal features and a seeded true ``w, b``."""
    rng = _rng(seed)
    w, b = rng.normal(size=(dim, 1)), rng.normal()
    x = rng.normal(size=(size, dim))
    y = x @ w + b + noise * rng.normal(size=(size, 1))
    return Dataset("synthetic_regression", {"x": Dense(x.astype(np.float32)),
                                            "y": Dense(y.astype(np.float32))}, seed)


def synthetic_classification(seed: int = 0, size: int = 2048, dim: int = 64, classes: int = 10,
                             spread: float = 0.5) -> Dataset:
    """Gaussian blobs: class centers drawn from N(0, 1) per feature, examples center + N(0,
    spread^2); with many features the classes are linearly separable."""
    rng = _rng(seed)
    centers = rng.normal(size=(classes, dim))
    label = rng.integers(0, classes, size)
    x = centers[label] + spread * rng.normal(size=(size, dim))
    return Dataset("synthetic_classification", {"x": Dense(x.astype(np.float32)),
                                                "label": _labels(label)}, seed)


def zipf_probabilities(n: int, exponent: float) -> np.ndarray:
    """P(rank k) proportional to k^-exponent for ranks 1..n."""
    p = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def _zipf_ids(rng: np.random.Generator, vocab: int, count: int, exponent: float) -> np.ndarray:
    """`count` ids whose popularity follows Zipf; which id has which rank is seeded."""
    ranks = rng.choice(vocab, size=count, p=zipf_probabilities(vocab, exponent))
    return rng.permutation(vocab)[ranks]


def ctr(seed: int = 0, size: int = 8192, vocab: int = 1000,
        slots: Sequence[str] = ("title_ids", "brand_ids"), max_len: int = 10,
        zipf_exponent: float = 1.1, noise: float = 0.3, dense: int = 0) -> Dataset:
    """Click logs: per slot, a sequence of 1..max_len Zipf ids per example; each id has a hidden
    weight, and an example is clicked (label 1) when the summed mean weight of its slots, plus
    noise, is above the median (so about half are). With `dense` > 0, a ``dense`` column of
    that many standard normal features too, which a hidden linear weight adds to the score."""
    rng = _rng(seed)
    columns: dict[str, Column] = {}
    score = np.zeros(size)
    for slot in slots:
        lengths = rng.integers(1, max_len + 1, size)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids = _zipf_ids(rng, vocab, int(offsets[-1]), zipf_exponent)
        weight = rng.normal(size=vocab)
        score += np.add.reduceat(weight[ids], offsets[:-1]) / lengths
        columns[slot] = Ragged(ids.reshape(-1, 1), offsets)
    if dense:
        x = rng.normal(size=(size, dense))
        score += x @ rng.normal(size=dense) / np.sqrt(dense)
        columns = {"dense": Dense(x.astype(np.float32)), **columns}
    score += noise * rng.normal(size=size)
    columns["label"] = _labels(score > np.median(score))
    return Dataset("ctr", columns, seed)


def skipgram(seed: int = 0, size: int = 8192, vocab: int = 1000, neg_num: int = 5,
             window: int = 2, topics: int = 10, sentence_len: int = 16,
             zipf_exponent: float = 1.0) -> Dataset:
    """Skip-gram pairs from a synthetic corpus: each sentence has a topic and draws Zipf words
    from that topic's share of the vocabulary (id % topics == topic); (center, context) pairs
    are words at most `window` apart, and `neg_num` negatives per pair are drawn from the
    corpus unigram distribution to the power 3/4, as in word2vec."""
    if vocab < topics:
        raise DataError(f"skipgram: vocab {vocab} must be at least topics {topics}")
    rng = _rng(seed)
    offsets = [d for d in range(-window, window + 1) if d]
    per_sentence = sum(sentence_len - abs(d) for d in offsets)
    sentences = -(-size // per_sentence)
    topic_words = [np.arange(t, vocab, topics) for t in range(topics)]
    probs = [zipf_probabilities(len(w), zipf_exponent) for w in topic_words]
    topic = rng.integers(0, topics, sentences)
    corpus = np.stack([rng.choice(topic_words[t], size=sentence_len, p=probs[t]) for t in topic])
    # for offset d, a center at position j pairs with the context word at j + d
    centers = np.concatenate([corpus[:, max(0, -d):sentence_len - max(0, d)].ravel()
                              for d in offsets])
    contexts = np.concatenate([corpus[:, max(0, d):sentence_len - max(0, -d)].ravel()
                               for d in offsets])
    pick = rng.permutation(len(centers))[:size]
    counts = np.bincount(corpus.ravel(), minlength=vocab) ** 0.75
    negatives = rng.choice(vocab, size=(size, neg_num), p=counts / counts.sum())
    columns: dict[str, Column] = {"center_ids": _labels(centers[pick]),
                                  "context_ids": _labels(contexts[pick])}
    for k in range(neg_num):
        columns[f"neg_ids_{k}"] = _labels(negatives[:, k])
    return Dataset("skipgram", columns, seed)


def digits(seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1797 examples, no download): 64 features
    scaled to [0, 1] and labels 0..9. Needs the ``[data]`` extra."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("dataset 'digits' needs scikit-learn; install the extra: "
                        "pip install -e '.[data]'") from None
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    return Dataset("digits", {"x": Dense(x), "label": _labels(bunch.target)}, seed)


DATASETS: dict[str, Callable[..., Dataset]] = {
    "synthetic_regression": synthetic_regression,
    "synthetic_classification": synthetic_classification,
    "ctr": ctr,
    "skipgram": skipgram,
    "digits": digits,
}


def load_dataset(name: str, seed: int = 0, **params: Any) -> Dataset:
    """Make data set `name` (a key of `DATASETS`) with the generator's keyword arguments."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; one of {sorted(DATASETS)}")
    make = DATASETS[name]
    try:
        inspect.signature(make).bind(seed=seed, **params)
    except TypeError as err:
        raise DataError(f"dataset {name!r}: {err}") from None
    return make(seed=seed, **params)


def dataset_for(model: Model, name: str | None = None, seed: int = 0, **params: Any) -> Dataset:
    """The data set `name` (default: the model's own) sized to fit `model`, checked against its
    feeds. Model hints the generator does not take (e.g. sizes, for digits) are dropped; the
    check then catches a real mismatch."""
    name = name or model.data
    accepted = inspect.signature(DATASETS[name]).parameters if name in DATASETS else {}
    hints = {k: v for k, v in model.data_params.items() if k in accepted}
    dataset = load_dataset(name, seed, **{**hints, **params})
    dataset.check_model(model)
    return dataset


__all__ = ["DATASETS", "Column", "DataError", "Dataset", "Dense", "Feed", "Ragged", "Shard", "ctr",
           "dataset_for", "digits", "epoch_permutation", "load_dataset", "skipgram", "stream_start",
           "synthetic_classification", "synthetic_regression", "zipf_probabilities"]
