"""A model of one's own for a scenario: `model: {name: "my_model:regressor", hidden: 16}`.

A builder takes the scenario's `optimizer` (a spec dict), `lr` (a schedule dict or None), `seed`
and the other `model` keys as keyword arguments, and returns a `transpiler.models.Model`;
`make_model` assembles one from a function that declares the forward pass and the loss. The
module is found beside the scenario file, with no PYTHONPATH.
"""

from __future__ import annotations

from typing import Any

from transpiler import layers
from transpiler.framework import ParamAttr
from transpiler.models import Built, Model, make_model


def regressor(in_dim: int = 13, hidden: int = 16, optimizer: Any = None, lr: Any = None,
              seed: int = 0) -> Model:
    """``y ~ fc(tanh(fc(x, hidden)), 1)``, mean squared error."""

    def body() -> Built:
        x = layers.data("x", shape=[in_dim])
        y = layers.data("y", shape=[1])
        h = layers.fc(x, size=hidden, act="tanh", param_attr=ParamAttr(name="mine.fc0.w"),
                      bias_attr=ParamAttr(name="mine.fc0.b"))
        pred = layers.fc(h, size=1, param_attr=ParamAttr(name="mine.out.w"),
                         bias_attr=ParamAttr(name="mine.out.b"))
        loss = layers.mean(layers.square_error_cost(pred, y))
        return Built(["x", "y"], loss, "y", pred)

    return make_model("regressor", body, optimizer, lr, seed, data="synthetic_regression",
                      data_params={"dim": in_dim})
