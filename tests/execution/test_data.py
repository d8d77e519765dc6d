"""Data sets: seeded determinism, shards that join into the global batch, epochs, Zipf skew, LoD."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.execution import data as D
from transpiler import models as M

from data_helpers import assert_feeds_equal, join


def flat(feed: D.Feed) -> np.ndarray:
    return np.concatenate([np.ravel(v[0] if isinstance(v, tuple) else v).astype(np.float64)
                           for v in feed.values()])


SMALL = {
    "synthetic_regression": {"size": 50},
    "synthetic_classification": {"size": 50},
    "ctr": {"size": 50},
    "skipgram": {"size": 50},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_seed_same_batches_other_seed_other_batches(name: str) -> None:
    a = D.load_dataset(name, seed=3, **SMALL[name])
    b = D.load_dataset(name, seed=3, **SMALL[name])
    c = D.load_dataset(name, seed=4, **SMALL[name])
    for step in (0, 7):
        assert_feeds_equal(a.batch(step, 16), b.batch(step, 16))
    assert not np.array_equal(flat(a.batch(0, 16)), flat(c.batch(0, 16)))


@settings(max_examples=40, deadline=None)
@given(trainers=st.integers(1, 4), batch_size=st.integers(1, 9), step=st.integers(0, 12),
       name=st.sampled_from(["ctr", "synthetic_classification"]))
def test_shards_of_a_step_join_into_the_global_batch(trainers: int, batch_size: int, step: int,
                                                     name: str) -> None:
    # 50 examples: global batches regularly straddle an epoch boundary.
    dataset = D.load_dataset(name, seed=1, size=50)
    parts = [dataset.shard(i, trainers).batch(step, batch_size) for i in range(trainers)]
    assert_feeds_equal(join(parts), dataset.batch(step, batch_size * trainers))


def test_epochs_visit_every_example_once_and_reshuffle() -> None:
    dataset = D.load_dataset("synthetic_regression", seed=5, size=40)
    first, second = dataset.positions(0, 40), dataset.positions(40, 40)
    assert sorted(first) == sorted(second) == list(range(40))
    assert not np.array_equal(first, second)
    # a batch that straddles the boundary takes the end of epoch 0, then the start of epoch 1
    np.testing.assert_array_equal(dataset.positions(30, 20), np.concatenate([first[30:], second[:10]]))
    shard = dataset.shard(1, 2)
    for got, step in zip(shard.batches(7, 3, start=2), (2, 3, 4)):
        assert_feeds_equal(got, shard.batch(step, 7))


def test_zipf_skew_of_ctr_ids() -> None:
    dataset = D.load_dataset("ctr", seed=0, vocab=1000)
    ids = dataset.columns["title_ids"].values.ravel()
    counts = np.sort(np.bincount(ids, minlength=1000))[::-1]
    # Zipf(1.1) over 1000 ids: the top 10% of ids carry ~77% of occurrences (uniform: 10%).
    assert counts[:100].sum() / counts.sum() > 0.65
    assert counts[0] > 5 * counts[9]
    # popularity is not tied to small ids (the rank -> id map is a seeded permutation)
    assert np.argmax(np.bincount(ids)) != 0


def test_ctr_lod_sequences_are_valid() -> None:
    dataset = D.load_dataset("ctr", seed=2, size=300, vocab=500, max_len=7)
    for slot in ("title_ids", "brand_ids"):
        values, lod = dataset.batch(0, 64)[slot]
        offsets = np.asarray(lod[0])
        assert values.dtype == np.int64 and values.shape == (offsets[-1], 1)
        assert offsets[0] == 0 and len(offsets) == 65
        lengths = np.diff(offsets)
        assert lengths.min() >= 1 and lengths.max() <= 7
        assert 0 <= values.min() and values.max() < 500


def test_ctr_labels_depend_on_ids() -> None:
    dataset = D.load_dataset("ctr", seed=0, size=4000, slots=("title_ids",), noise=0.1)
    col = dataset.columns["title_ids"]
    assert isinstance(col, D.Ragged)
    labels = dataset.columns["label"].values.ravel()
    example = np.repeat(np.arange(dataset.size), np.diff(col.offsets))
    ids = col.values.ravel()

    def spread(y: np.ndarray) -> float:
        """Std over popular ids of the click rate of examples holding the id."""
        hits = np.bincount(ids, minlength=1000)
        rate = np.bincount(ids, weights=y[example], minlength=1000) / np.maximum(hits, 1)
        return float(rate[hits >= 100].std())

    shuffled = np.random.default_rng(0).permutation(labels)
    assert 0.4 < labels.mean() < 0.6
    assert spread(labels) > 2.5 * spread(shuffled)


def test_classification_blobs_are_separable_and_regression_is_linear() -> None:
    cls = D.load_dataset("synthetic_classification", seed=0)
    x, y = cls.columns["x"].values, cls.columns["label"].values.ravel()
    centers = np.stack([x[y == c].mean(0) for c in range(10)])
    nearest = np.argmin(((x[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)
    assert (nearest == y).mean() > 0.99

    reg = D.load_dataset("synthetic_regression", seed=0, noise=0.1)
    xr, yr = reg.columns["x"].values, reg.columns["y"].values
    design = np.hstack([xr, np.ones((len(xr), 1))])
    residual = yr - design @ np.linalg.lstsq(design, yr, rcond=None)[0]
    assert residual.std() == pytest.approx(0.1, rel=0.1)


def test_skipgram_pairs_share_a_topic_and_negatives_follow_frequency() -> None:
    dataset = D.load_dataset("skipgram", seed=0, vocab=200, topics=4, neg_num=3)
    center = dataset.columns["center_ids"].values.ravel()
    context = dataset.columns["context_ids"].values.ravel()
    assert np.all(center % 4 == context % 4) and not np.all(center == context)
    negs = np.concatenate([dataset.columns[f"neg_ids_{k}"].values.ravel() for k in range(3)])
    assert dataset.fields == ["center_ids", "context_ids", "neg_ids_0", "neg_ids_1", "neg_ids_2"]
    counts = np.bincount(negs, minlength=200)
    assert counts[:4].sum() > 10 * counts[-4:].sum()  # the Zipf head is sampled far more often


def test_digits_scaled_to_unit_range() -> None:
    pytest.importorskip("sklearn")
    dataset = D.load_dataset("digits")
    x, y = dataset.columns["x"].values, dataset.columns["label"].values
    assert x.shape == (1797, 64) and x.dtype == np.float32
    assert x.min() == 0.0 and x.max() == 1.0
    assert sorted(np.unique(y)) == list(range(10)) and y.dtype == np.int64


def test_digits_against_a_model_of_other_width_names_the_field() -> None:
    pytest.importorskip("sklearn")
    with pytest.raises(D.DataError, match=r"field 'x' has rows of float32\[64\].*float32\[32\]"):
        D.dataset_for(M.mlp(sizes=[32, 10]), "digits")


def test_digits_without_sklearn_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(D.DataError, match=r"scikit-learn.*\[data\]"):
        D.load_dataset("digits")


def test_dataset_for_sizes_data_to_the_model() -> None:
    model = M.ctr_dnn(vocab=50, slots=("a", "b", "c"))
    dataset = D.dataset_for(model, seed=0)
    assert dataset.name == "ctr" and dataset.fields == ["a", "b", "c", "label"]
    assert dataset.columns["a"].values.max() < 50
    w2v = D.dataset_for(M.word2vec(neg_num=2))
    assert set(w2v.batch(0, 4, M.word2vec(neg_num=2).feeds)) == {
        "center_ids", "context_ids", "neg_ids_0", "neg_ids_1"}


def test_errors_name_the_culprit() -> None:
    with pytest.raises(D.DataError, match="unknown dataset 'mnist'"):
        D.load_dataset("mnist")
    with pytest.raises(D.DataError, match="dataset 'ctr'.*'bogus'"):
        D.load_dataset("ctr", bogus=1)
    with pytest.raises(D.DataError, match="no field 'y' that model 'linear' feeds"):
        D.dataset_for(M.linear(), "synthetic_classification")

    with pytest.raises(D.DataError, match="no field 'title_ids'"):
        D.dataset_for(M.ctr_dnn(), "skipgram")
    with pytest.raises(D.DataError, match="trainer_id 2"):
        D.load_dataset("ctr", size=10).shard(2, 2)
    with pytest.raises(D.DataError, match="no field 'nope'"):
        D.load_dataset("ctr", size=10).batch(0, 2, ["nope"])


def test_a_data_sets_epoch_orders_are_kept_read_only_and_equal_to_freshly_drawn_ones() -> None:
    data = D.synthetic_classification(seed=3, size=50)
    orders = [data.epoch_order(e) for e in (0, 1, 0, 2, 0)]
    for epoch, order in zip((0, 1, 0, 2, 0), orders):
        np.testing.assert_array_equal(order, D.epoch_permutation(3, epoch, 50))
        assert not order.flags.writeable
    assert orders[2] is orders[0] and orders[4] is not orders[0]  # epoch 0 dropped for 2
