"""fluid's ``dist_word2vec.py`` model on a tiny synthetic corpus, run by `dist_harness`: the 4
words before a word predict it. Each context word is looked up in one shared table
``shared_w`` with ``is_sparse`` and ``is_distributed`` (a distributed lookup table: its rows
live on the pservers, which the trainers ask for the rows of their ids), concat, fc sigmoid,
fc softmax over the vocabulary, cross entropy, SGD (which the table's pservers run too).
``IS_DISTRIBUTED=0`` in the environment (as fluid's scripts take their variants) looks the
words up with ``is_sparse`` alone: by 1.8's and 2.x's default the table is then prefetched
(``remote_prefetch``), its rows read from the pservers that hold its blocks."""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np

import runtime.paddle as paddle
import runtime.paddle.fluid as fluid
from dist_harness import DEFAULT_BATCH_SIZE, Model, TestDistRunnerBase, runtime_main

DICT_SIZE = 40
EMBED_SIZE = 8
HIDDEN_SIZE = 16
N = 5
IS_DISTRIBUTED = bool(int(os.environ.get("IS_DISTRIBUTED", "1")))
"""Words of an n-gram: N - 1 of context, then the word to predict."""
CORPUS_WORDS = 400


def corpus(seed: int) -> np.ndarray:
    """A word stream with structure to learn: mostly each word's successor is fixed (a seeded
    permutation of the vocabulary), now and then a random word."""
    rng = np.random.RandomState(seed)
    successor = rng.permutation(DICT_SIZE)
    words = [int(rng.randint(DICT_SIZE))]
    for _ in range(CORPUS_WORDS - 1):
        words.append(int(successor[words[-1]]) if rng.rand() < 0.8 else int(rng.randint(DICT_SIZE)))
    return np.array(words, np.int64)


def ngram_reader(seed: int) -> Any:
    """A reader of (w0, w1, w2, w3, next) samples, each an int64 array of shape (1,)."""
    def reader() -> Iterator[tuple[np.ndarray, ...]]:
        words = corpus(seed)
        for i in range(len(words) - N + 1):
            yield tuple(words[i + j:i + j + 1] for j in range(N))
    return reader


class TestDistWord2vec(TestDistRunnerBase):
    def get_model(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Model:
        names = ["firstw", "secondw", "thirdw", "forthw"]
        words = [fluid.layers.data(name=name, shape=[1], dtype="int64") for name in names]
        next_word = fluid.layers.data(name="nextw", shape=[1], dtype="int64")
        embeds = [fluid.layers.embedding(
            input=word, size=[DICT_SIZE, EMBED_SIZE], dtype="float32", is_sparse=True,
            is_distributed=IS_DISTRIBUTED, param_attr=fluid.ParamAttr(
                name="shared_w", initializer=fluid.initializer.Constant(value=0.1)))
            for word in words]
        concat = fluid.layers.concat(input=embeds, axis=1)
        hidden = fluid.layers.fc(input=concat, size=HIDDEN_SIZE, act="sigmoid")
        predict = fluid.layers.fc(input=hidden, size=DICT_SIZE, act="softmax")
        avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=next_word))
        test_program = fluid.default_main_program().clone(for_test=True)
        fluid.optimizer.SGD(learning_rate=0.5).minimize(avg_cost)
        train_reader = paddle.batch(ngram_reader(seed=0), batch_size=batch_size)
        test_reader = paddle.batch(ngram_reader(seed=1), batch_size=batch_size)
        return test_program, avg_cost, train_reader, test_reader, None, predict


if __name__ == "__main__":
    runtime_main(TestDistWord2vec)
