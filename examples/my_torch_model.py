"""A model of one's own written in PyTorch: `model: {name: "my_torch_model:cnn"}`.

The builder makes the `torch.nn.Module` (seeded with the scenario's seed, so that every node
that builds the model gets the same weights) and returns `transpiler.from_torch`'s capture of
it: the forward pass traced with torch.fx, a cross entropy loss against the ``label`` feed, and
the scenario's optimizer. Training starts from the module's own weights. Needs the ``[torch]``
extra.
"""

from __future__ import annotations

from typing import Any

from transpiler import from_torch
from transpiler.models import Model


def _digits_cnn(channels: int, hidden: int) -> Any:
    import torch
    from torch import nn

    class DigitsCNN(nn.Module):
        """8x8 images, flattened in the data: conv + relu + max pool, then two linear layers."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, channels, 3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.fc1 = nn.Linear(channels * 16, hidden)
            self.fc2 = nn.Linear(hidden, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.pool(torch.relu(self.conv(x.view(-1, 1, 8, 8))))
            return self.fc2(torch.relu(self.fc1(h.flatten(1))))

    return DigitsCNN()


def cnn(channels: int = 8, hidden: int = 128, optimizer: Any = None, lr: Any = None,
        seed: int = 0) -> Model:
    import torch

    torch.manual_seed(seed)
    module = _digits_cnn(channels, hidden)
    return from_torch(module, torch.zeros(2, 64), loss="cross_entropy", optimizer=optimizer,
                      lr=lr, seed=seed, data="synthetic_classification",
                      data_params={"dim": 64, "classes": 10})
