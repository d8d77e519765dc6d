"""The shuffle of numpy's legacy global generator, without numpy.

The original transpiler placed unsliced (param, grad) pairs in an order drawn by
``np.random.seed(program.random_seed); np.random.shuffle(items)``. To place blocks exactly where
it did, `numpy_legacy_shuffle` draws the same permutation: numpy's legacy seeding is MT19937's
``init_genrand`` (the same state Python's `random.Random` uses once its state is set), and its
shuffle is Fisher-Yates from the end, each index drawn by masked rejection sampling on 32-bit
outputs (numpy's ``random_interval``). The transpiler layer imports no numpy; the tests check
this against numpy itself.
"""

from __future__ import annotations

import random
from typing import MutableSequence, TypeVar

T = TypeVar("T")

_N = 624  # MT19937's state length


def _init_genrand(seed: int) -> list[int]:
    """MT19937's state for a 32-bit seed, as numpy's legacy ``seed(int)`` makes it."""
    state = [seed & 0xFFFFFFFF]
    for i in range(1, _N):
        prev = state[-1]
        state.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
    return state


def _interval(rng: random.Random, top: int) -> int:
    """A uniform draw from [0, top] as numpy's ``random_interval`` makes it (top < 2**32)."""
    if top == 0:
        return 0
    mask = (1 << top.bit_length()) - 1
    while True:
        value = rng.getrandbits(32) & mask
        if value <= top:
            return value


def numpy_legacy_shuffle(items: MutableSequence[T], seed: int) -> None:
    """Shuffle `items` in place as ``np.random.seed(seed); np.random.shuffle(items)`` does."""
    if not 0 <= seed < 2**32:
        raise ValueError(f"a numpy legacy seed is in [0, 2**32), got {seed}")
    rng = random.Random()
    rng.setstate((3, (*_init_genrand(seed), _N), None))
    for i in reversed(range(1, len(items))):
        j = _interval(rng, i)
        items[i], items[j] = items[j], items[i]
