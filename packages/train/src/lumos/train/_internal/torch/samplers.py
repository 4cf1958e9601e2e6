"""Samplers whose position is restored in O(1) instead of by replaying the epoch.

torchdata's ``StatefulDataLoader`` resumes a sampler that has no state of its own by
calling ``next()`` once per index already yielded, and its ``RandomSampler`` does
the same after regenerating the permutation: tens of milliseconds for 100,000
samples. These subclasses jump to the position: restoring costs what starting the
epoch costs, plus a slice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler
from torchdata.stateful_dataloader.sampler import RandomSampler, _StatefulRandomSamplerIterator


class _RangeIterator(Iterator[int]):
    """``iter(range(n))`` with a ``yielded`` position (torchdata's ``Stateful`` protocol)."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._it = iter(range(n))
        self.yielded = 0

    def __iter__(self) -> _RangeIterator:
        return self

    def __next__(self) -> int:
        value = next(self._it)
        self.yielded += 1
        return value

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.yielded = int(state_dict["yielded"])
        self._it = iter(range(self.yielded, self._n))


class SequentialSampler(Sampler[int]):
    """Indices ``0 .. len(data_source) - 1`` in order; resumes by jumping to the position."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return _RangeIterator(len(self.data_source))

    def __len__(self) -> int:
        return len(self.data_source)


class _JumpingRandomIterator(_StatefulRandomSamplerIterator):  # type: ignore[misc]
    """torchdata's random-permutation iterator, restored by an index jump (no replacement).

    The permutation is drawn at the first ``next()`` from the generator state taken
    when the iterator was created (torchdata draws it at creation, and creates several
    iterators per epoch and per restore: each draw of 100,000 indices costs ~15 ms).
    """

    def __init__(self, sampler: RandomSampler) -> None:
        self.sampler = sampler
        self.generator_state = sampler.generator.get_state()
        self.yielded = 0
        self.next_yielded = None
        self.n = len(sampler.data_source)
        self.replacement = sampler.replacement
        self.num_samples = sampler.num_samples
        self.chunk_size = 32
        self.perm: list[int] | None = None
        self.perm_index = 0
        self.chunk_index = 0

    def __next__(self) -> int:
        if self.perm is None:
            self.sampler.generator.set_state(self.generator_state)
            self.perm = self._get_perm()
        return int(super().__next__())

    def state_dict(self) -> dict[str, Any]:
        # the generator state as bytes: pickles ~10x faster than a ByteTensor
        return {
            self._YIELDED: self.yielded,
            self._GENERATOR: self.generator_state.numpy().tobytes(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        yielded = int(state_dict[self._YIELDED])
        state = state_dict[self._GENERATOR]
        if isinstance(state, bytes):
            state = torch.frombuffer(bytearray(state), dtype=torch.uint8)
        self.generator_state = state
        self.sampler.generator.set_state(self.generator_state)
        self.perm = self._get_perm()  # the epoch's permutation, from its saved seed state
        self.perm_index = yielded
        self.yielded = yielded
        self.next_yielded = None


class ShuffleSampler(RandomSampler):  # type: ignore[misc]
    """torchdata's stateful ``RandomSampler`` without replacement, restored in O(1)."""

    def __init__(self, data_source: Sized, generator: Any = None) -> None:
        super().__init__(data_source, replacement=False, generator=generator)

    def __iter__(self) -> Iterator[int]:
        return _JumpingRandomIterator(self)
