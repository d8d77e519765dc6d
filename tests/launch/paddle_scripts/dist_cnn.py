"""fluid's ``dist_mnist.py`` model at the size of the 8x8 digits, run by `dist_harness`: two
``fluid.nets.simple_img_conv_pool`` blocks (3x3 convs, relu, 2x2 max pools: 8x8 -> 4x4 -> 2x2),
fc 10 softmax, cross entropy, ``fluid.layers.accuracy`` of the batch, Momentum."""

from __future__ import annotations

from typing import Any

import runtime.paddle as paddle
import runtime.paddle.fluid as fluid
from dist_harness import DEFAULT_BATCH_SIZE, Model, TestDistRunnerBase, runtime_main


def cnn_model(images: Any) -> Any:
    conv_pool_1 = fluid.nets.simple_img_conv_pool(
        input=images, filter_size=3, num_filters=4, pool_size=2, pool_stride=2,
        conv_padding=1, act="relu")
    conv_pool_2 = fluid.nets.simple_img_conv_pool(
        input=conv_pool_1, filter_size=3, num_filters=8, pool_size=2, pool_stride=2,
        conv_padding=1, act="relu")
    return fluid.layers.fc(input=conv_pool_2, size=10, act="softmax")


class TestDistCNN(TestDistRunnerBase):
    def get_model(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Model:
        images = fluid.layers.data(name="pixel", shape=[1, 8, 8], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        predict = cnn_model(images)
        avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=label))
        batch_size_tensor = fluid.layers.create_tensor(dtype="int64")
        batch_acc = fluid.layers.accuracy(input=predict, label=label, total=batch_size_tensor)
        test_program = fluid.default_main_program().clone(for_test=True)
        fluid.optimizer.Momentum(learning_rate=0.05, momentum=0.9).minimize(avg_cost)
        train_reader = paddle.batch(paddle.dataset.digits.train(), batch_size=batch_size)
        test_reader = paddle.batch(paddle.dataset.digits.train(seed=1), batch_size=batch_size)
        return test_program, avg_cost, train_reader, test_reader, batch_acc, predict


if __name__ == "__main__":
    runtime_main(TestDistCNN)
