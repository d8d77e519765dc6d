"""Torch modules that tests/transpiler/test_from_torch_ops.py captures with `transpiler.from_torch`:
an embedding followed by every activation the capture maps (as modules and as functions), and
`embedding_classifier`, a scenario's builder (``model: {name: "torch_models:embedding_
classifier"}``) whose table the pservers may hold (``distributed: true``).

DESIGN: a module of the tests' folder, not a test module, so that a scenario names it and
every node that builds the model imports it as a builder is imported (on the usual path)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from transpiler import from_torch
from transpiler.models import Model


class Activations(nn.Module):
    """ids -> embedding (padding id 0) -> linear -> GELU, SiLU, LeakyReLU, ELU, Softplus,
    Hardtanh in a chain -> the sum of their functional forms (GELU's tanh approximation, ReLU6)
    -> logits. Ids of shape [N] (one id a row), [N, L] (`bag`: L ids, flattened after the
    lookup) or [N, 1] (`keep_one`: torch keeps the trailing 1)."""

    def __init__(self, vocab: int = 40, dim: int = 6, hidden: int = 12, classes: int = 5,
                 bag: int = 0, sparse: bool = False) -> None:
        super().__init__()
        self.bag = bag
        self.emb = nn.Embedding(vocab, dim, padding_idx=0, sparse=sparse)
        self.fc = nn.Linear(dim * max(bag, 1), hidden)
        self.chain = nn.Sequential(nn.GELU(), nn.SiLU(), nn.LeakyReLU(0.1), nn.ELU(0.7),
                                   nn.Softplus(2.0, 5.0), nn.Hardtanh(-0.8, 0.9))
        self.out = nn.Linear(hidden, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids).flatten(1)
        h = self.chain(self.fc(h))
        h = (F.gelu(h, approximate="tanh") + F.silu(h) + F.leaky_relu(h, 0.2) + F.elu(h)
             + F.softplus(h) + F.hardtanh(h) + F.relu6(h * 8.0))
        return self.out(h)  # type: ignore[no-any-return]


class EmbeddingClassifier(nn.Module):
    """Predicts a skip-gram pair's context word from its center word."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.act = nn.GELU()
        self.out = nn.Linear(dim, vocab)

    def forward(self, center_ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.emb(center_ids)))  # type: ignore[no-any-return]


def embedding_classifier(vocab: int = 60, dim: int = 8, distributed: bool = False,
                         optimizer: Any = None, lr: Any = None, seed: int = 0) -> Model:
    """A scenario's builder: `EmbeddingClassifier` on the skip-gram set, its table held by the
    pservers when `distributed`."""
    torch.manual_seed(seed)
    return from_torch(EmbeddingClassifier(vocab, dim), torch.zeros(2, dtype=torch.int64),
                      loss="cross_entropy", label="context_ids", optimizer=optimizer, lr=lr,
                      seed=seed, data="skipgram", data_params={"vocab": vocab},
                      distributed_table="emb" if distributed else None)
