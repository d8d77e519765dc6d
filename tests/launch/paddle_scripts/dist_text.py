"""A text classifier in the style of fluid's ``dist_text_classification.py``, run by
`dist_harness`, on tiny synthetic reviews: variable-length sequences of word ids (a LoD input,
``lod_level=1``, which the harness's ``DataFeeder`` joins into one LoDTensor per batch) ->
embedding -> ``fluid.nets.sequence_conv_pool`` (sequence_conv over a window of 3 words, tanh,
max over each review) -> fc softmax over 2 classes, cross entropy, accuracy, SGD."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

import runtime.paddle as paddle
import runtime.paddle.fluid as fluid
from dist_harness import DEFAULT_BATCH_SIZE, Model, TestDistRunnerBase, runtime_main

DICT_SIZE = 50
EMBED_SIZE = 8
NUM_FILTERS = 12
WINDOW = 3
LENGTHS = (2, 9)
"""Words per review, both ends included."""
REVIEWS = 200
POSITIVE = range(0, 8)
NEGATIVE = range(8, 16)
"""Words that carry the sentiment; the rest are neutral."""


def reviews(seed: int) -> Any:
    """A reader of (word ids, [label]) samples: a label drawn at random, then a review of
    neutral words and, each word with even odds, words of the label's sentiment."""
    def reader() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.RandomState(seed)
        for _ in range(REVIEWS):
            label = rng.randint(2)
            length = rng.randint(LENGTHS[0], LENGTHS[1] + 1)
            sentiment = rng.choice(POSITIVE if label else NEGATIVE, length)
            neutral = rng.randint(NEGATIVE.stop, DICT_SIZE, length)
            words = np.where(rng.rand(length) < 0.5, sentiment, neutral)
            yield words.astype(np.int64), np.array([label], np.int64)
    return reader


class TestDistText(TestDistRunnerBase):
    def get_model(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Model:
        words = fluid.layers.data(name="words", shape=[1], dtype="int64", lod_level=1)
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        emb = fluid.layers.embedding(input=words, size=[DICT_SIZE, EMBED_SIZE])
        conv = fluid.nets.sequence_conv_pool(input=emb, num_filters=NUM_FILTERS,
                                             filter_size=WINDOW, act="tanh", pool_type="max")
        predict = fluid.layers.fc(input=conv, size=2, act="softmax")
        avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=label))
        acc = fluid.layers.accuracy(input=predict, label=label)
        test_program = fluid.default_main_program().clone(for_test=True)
        fluid.optimizer.SGD(learning_rate=0.5).minimize(avg_cost)
        train_reader = paddle.batch(reviews(seed=0), batch_size=batch_size)
        test_reader = paddle.batch(reviews(seed=1), batch_size=batch_size)
        return test_program, avg_cost, train_reader, test_reader, acc, predict


if __name__ == "__main__":
    runtime_main(TestDistText)
