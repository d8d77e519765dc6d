"""An MLP in the style of fluid's distributed test scripts, run by `dist_harness`: 64 features
of pslab's ``synthetic_classification`` (gaussian blobs, 10 classes) -> fc 32 relu -> fc 10
softmax, cross entropy, Adam (the pservers keep Adam's moments and beta powers)."""

from __future__ import annotations

from typing import Any

import runtime.paddle as paddle
import runtime.paddle.fluid as fluid
from dist_harness import DEFAULT_BATCH_SIZE, Model, TestDistRunnerBase, runtime_main


class TestDistMLP(TestDistRunnerBase):
    def get_model(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Model:
        x = fluid.layers.data(name="x", shape=[64], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        hidden = fluid.layers.fc(input=x, size=32, act="relu")
        predict = fluid.layers.fc(input=hidden, size=10, act="softmax")
        avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=label))
        test_program = fluid.default_main_program().clone(for_test=True)
        fluid.optimizer.Adam(learning_rate=0.01).minimize(avg_cost)
        data: Any = paddle.dataset.synthetic_classification
        train_reader = paddle.batch(data.train(), batch_size=batch_size)
        test_reader = paddle.batch(data.train(seed=1), batch_size=batch_size)
        return test_program, avg_cost, train_reader, test_reader, None, predict


if __name__ == "__main__":
    runtime_main(TestDistMLP)
