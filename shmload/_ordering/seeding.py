"""Seeds: one base seed per loader, streams derived from (seed, epoch, batch position).

Why per batch rather than per worker (as torch does): a batch's random augmentations
then depend only on which batch it is, not on which worker happened to load it, so the
same ``seed`` gives bit-identical batches for any ``num_workers``, including 0.

The sampler's order comes from a :class:`numpy.random.SeedSequence` (stream
``SAMPLER_STREAM``; for more than ``EXACT_SHUFFLE_LIMIT`` samples it keys a bijection
computed a batch at a time, see NOTE [ Shuffling a huge range ]); a batch's global
seeds come from a keyed BLAKE2b hash of (seed, epoch, position). Both are
full-avalanche mixers, so neighbouring batches get unrelated seeds and the sampler
never shares random numbers with the augmentations. The hash is used per batch because
it is ~20x cheaper than building a SeedSequence (0.5 against 11 us, docs/performance.md), and seeding runs
once per batch in the worker's hot path.
"""

from __future__ import annotations

import _random
import hashlib
import math
import random
import secrets
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .._core._torch import loaded_torch

SAMPLER_STREAM = 0
TORCH_SEED_MASK = 2**63 - 1  # torch's seeds are 63-bit: torch.initial_seed() fits in an int64


def draw_base_seed(generator=None) -> int:
    """A fresh base seed for a loader created with ``seed=None``.

    Drawn from a torch ``generator`` when one is given, else from torch's global
    generator when torch is already imported (so ``torch.manual_seed`` makes runs
    repeatable, as users of torch's DataLoader expect), else from the OS.
    """
    torch = loaded_torch()
    if generator is not None or torch is not None:
        if torch is None:
            raise TypeError("generator= is a torch.Generator, but torch is not imported")
        value = torch.empty((), dtype=torch.int64).random_(generator=generator).item()
        return int(value) & (2**63 - 1)
    return secrets.randbits(63)


def sequence(seed: int, epoch: int, stream: int, position: int = 0) -> np.random.SeedSequence:
    return np.random.SeedSequence(entropy=seed, spawn_key=(epoch, stream, position))


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The shuffled order of ``range(n)`` for this epoch."""
    return np.random.default_rng(sequence(seed, epoch, SAMPLER_STREAM)).permutation(n)


# NOTE [ Shuffling a huge range ]
# seeding.permutation() draws an exact uniform permutation, but it is a table of n int64s
# (8 n bytes, built before the first batch): 8 TiB for 2**40 samples, and an "endless"
# dataset (len() == sys.maxsize) cannot have one at all. Above EXACT_SHUFFLE_LIMIT
# samples (sampler.shuffled() decides; at or below it the exact permutation is kept, so
# every order, saved state and test that worked before is unchanged) the order is
# instead a keyed bijection of range(n), computed for just the positions asked for (a
# batch at a time, in memory proportional to the batch): RangeShuffle, a Feistel network
# on Z_a x Z_c (a = ceil(sqrt(n)), c = ceil(n / a), so a * c >= n), made a bijection of
# range(n) by cycle-walking. Why it is one:
# - a position x is split into (L, R) = (x // c, x % c); a round maps (L, R), L in Z_p and
#   R in Z_q, to (R, (L + F(R)) mod p), which is invertible whatever F is (R is kept,
#   then L = (new R - F(R)) mod p) and swaps the moduli; after an even number of rounds
#   they are (a, c) again, and L * c + R is a permutation of range(a * c);
# - cycle-walking (permute again while the result is >= n) then maps range(n) into
#   itself one to one: the walk from x follows x's cycle of that permutation, which
#   returns to x, so it ends, and two positions never reach one index (walking back
#   from an index is unique). Since a * c - n < a, a walk is needed with probability
#   below 1 / sqrt(n) (1 in 65,536 at the threshold): about one pass per batch.
# F is the SplitMix64 finalizer (full avalanche on 64 bits) of R XOR a round key; the
# FEISTEL_ROUNDS keys come from the sampler's SeedSequence (seed, epoch, SAMPLER_STREAM),
# so the order is fixed by (seed, epoch) and changes with the epoch, as the exact one.
# It is a well-mixed pseudo-random order, not a uniform draw from all n! permutations
# (no table-free scheme is); what a shuffle needs.
EXACT_SHUFFLE_LIMIT = 2**32  # samples; the exact permutation's table is then at most 32 GiB
FEISTEL_ROUNDS = 6  # even: the moduli end as they began
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))  # SplitMix64's multipliers


class RangeShuffle:
    """A seeded bijection of ``range(n)``, ``n`` up to ``sys.maxsize``, evaluated at any
    positions without a table (NOTE [ Shuffling a huge range ])."""

    def __init__(self, seed: int, epoch: int, n: int):
        self.n = int(n)
        self.a = math.isqrt(max(self.n - 1, 0)) + 1  # ceil(sqrt(n)): both moduli below 2**32
        self.c = -(-self.n // self.a)
        self.keys = sequence(seed, epoch, SAMPLER_STREAM).generate_state(FEISTEL_ROUNDS, np.uint64)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The indices (int64) at ``positions`` (integers in ``[0, n)``) of the order."""
        out = np.asarray(positions, dtype=np.uint64)
        if out.size == 0:
            return out.astype(np.int64)
        out = self._network(out)
        walking = np.flatnonzero(out >= self.n)
        while walking.size:  # cycle-walking: out of range, so permute again
            out[walking] = self._network(out[walking])
            walking = walking[out[walking] >= self.n]
        return out.astype(np.int64)

    def _network(self, x: np.ndarray) -> np.ndarray:
        """The Feistel network's permutation of ``range(a * c)``. (Arrays throughout:
        uint64 arithmetic wraps silently, as the mixing wants; no value here overflows.)"""
        a, c = np.uint64(self.a), np.uint64(self.c)
        left, right, p, q = x // c, x % c, a, c  # left in Z_p, right in Z_q
        for key in self.keys:
            z = right ^ key
            z ^= z >> np.uint64(30)
            z *= _MIX[0]
            z ^= z >> np.uint64(27)
            z *= _MIX[1]
            z ^= z >> np.uint64(31)
            left, right, p, q = right, (left + z % p) % p, q, p
        return left * c + right


def batch_seed(seed: int, epoch: int, position: int, rank: int = 0, part: int = 0) -> int:
    """The 64-bit seed of one batch's global RNGs (of its part ``part``: NOTE [ Parts of a
    batch ], parts.py). ``rank`` is the process's rank in a distributed job: ranks whose
    loaders share a seed still augment differently (with one seed for all, batch 5 of
    every rank would get the same crops and flips)."""
    # rank 0 keeps the key of versions before ranks were mixed in, and part 0 the key of
    # versions before parts: a run's seeds do not change
    key = b"%d:%d:%d" % (seed, epoch, position) if rank == 0 else b"%d:%d:%d:%d" % (seed, epoch, position, rank)
    if part:
        key += b"/%d" % part
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, person=b"shmload-batch").digest(), "little")


def stream_position(draw: int, worker: int, streams: int) -> int:
    """The seed position of an iterable source's draw: fixed by the worker and its draw
    number, not by the delivery order (which depends on when streams end)."""
    return draw * streams + worker


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The 64-bit seed of one sample of an elastic epoch, at its global ``position``
    (NOTE [ The global sequence ], elastic.py): no rank, no batch, so it is the same for
    any world size. A key of its own (``person``), apart from every batch's."""
    key = b"%d:%d:%d" % (seed, epoch, position)
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, person=b"shmload-sample").digest(), "little")


def seed_globals(seed: int, epoch: int, position: int, rank: int = 0, part: int = 0) -> None:
    """Seed Python's ``random``, numpy's global RNG and (if imported) torch's for one batch
    (for its part ``part``)."""
    seed_with(batch_seed(seed, epoch, position, rank, part))


def seed_sample(seed: int, epoch: int, first: int, offset: int = 0) -> None:
    """Seed the global RNGs for the elastic epoch's sample at position ``first + offset``."""
    seed_with(sample_seed(seed, epoch, first + offset))


# random.seed(n) for an int n is the C base method of the random module's Random.seed,
# plus clearing gauss_next; called directly, the Python-level checks of a str or bytes
# seed are skipped: 4.1 against 5.6 us here, paid per batch, and per sample when elastic.
_seed_random = _random.Random.seed


def seed_with(value: int) -> None:
    """Seed the global RNGs with a 64-bit ``value`` (a batch's or a sample's seed): as
    ``random.seed(value)``, ``numpy.random.seed(value & 0xFFFFFFFF)`` and, when torch is
    imported, its CPU generator's ``manual_seed``."""
    inst = random._inst  # (the module's functions are its methods)
    _seed_random(inst, value)
    inst.gauss_next = None  # type: ignore[attr-defined]
    np.random.seed(value & 0xFFFFFFFF)
    torch = loaded_torch()
    if torch is not None:
        # The CPU generator only: torch.manual_seed() also visits every accelerator
        # backend and costs ~170 us (docs/performance.md), more than the rest of the batch's bookkeeping.
        # 63 bits, as torch's own seeds: torch.initial_seed() then fits in an int64, so a
        # sample holding it can be batched. Still a pure function of the batch.
        torch.default_generator.manual_seed(value & TORCH_SEED_MASK)


def worker_seed(seed: int, worker_id: int) -> int:
    """A worker's own seed, as torch's: base seed + worker id (modulo 2**64, the range
    torch.manual_seed() takes). What ``torch.initial_seed()`` returns in
    ``worker_init_fn``, and torch's ``get_worker_info().seed``."""
    return (seed + worker_id) % 2**64


def seed_worker(seed: int, worker_id: int) -> None:
    """Seed a worker's ``random``, numpy's and (if imported) torch's global RNGs at its
    start, before ``worker_init_fn``, the way torch's DataLoader does: distinct per
    worker (a forked worker would otherwise start with its parent's states, the same in
    every worker). Batches are seeded again each (:func:`seed_globals`), so this only
    matters to ``worker_init_fn`` and to whatever it sets up."""
    value = worker_seed(seed, worker_id)
    random.seed(value)
    # torch's _generate_state(base_seed, worker_id), which is this SeedSequence's state
    base = seed % 2**64
    np.random.seed(np.random.SeedSequence([worker_id, base & 0xFFFFFFFF, base >> 32, 0]).generate_state(4))
    torch = loaded_torch()
    if torch is not None:
        torch.manual_seed(value)  # once per worker: every backend, as torch's workers do


@contextmanager
def preserved_globals() -> Iterator[None]:
    """Restore the global RNG states afterwards.

    With ``num_workers=0`` batches are seeded in the caller's own process; without this
    the loader would silently reset the training code's random streams every batch.
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    torch = loaded_torch()
    torch_state = torch.get_rng_state() if torch is not None else None
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        if torch_state is not None:
            torch.set_rng_state(torch_state)
