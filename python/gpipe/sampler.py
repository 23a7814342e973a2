"""Which training samples each step of a job takes, as the stages draw them
(services/data/sampler.h): to feed a PyTorch loop the same batches, or to
find the samples of a step whose loss spiked.

Step s takes positions s*B .. s*B+B-1 of the endless sequence of epochs;
each epoch is a Fisher-Yates shuffle of the training split drawn from
(seed, epoch) by SplitMix64. The step's samples are then cut into M
contiguous micro-batches (micro_batch_ranges).
"""

import array
import functools

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _split_mix64(x):
    x = (x + _GAMMA) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix_key(*parts):
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _split_mix64(h ^ _split_mix64(p & _MASK))
    return h


class _Rng:
    def __init__(self, key):
        self._key = key
        self._counter = 0

    def next_u64(self):
        v = _split_mix64(self._key ^ _split_mix64(self._counter))
        self._counter += 1
        return v

    def below(self, n):
        # Rejection keeps it unbiased, as the C++ generator does.
        limit = _MASK - _MASK % n
        while True:
            v = self.next_u64()
            if v < limit:
                return v % n


def epoch_order(seed, dataset_size, epoch):
    """The training split's indices in the order epoch `epoch` visits them."""
    return list(_epoch_order(seed, dataset_size, epoch))


# Steps walk forward through epochs: the last two shuffles serve nearly
# every call (a shuffle of 60000 samples takes 0.1 s in Python). Kept as
# 8-byte integers: a list of 10M Python ints holds 360 MB.
@functools.lru_cache(maxsize=2)
def _epoch_order(seed, dataset_size, epoch):
    order = list(range(dataset_size))
    rng = _Rng(_mix_key(seed, epoch))
    for i in range(dataset_size - 1, 0, -1):
        j = rng.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return array.array("q", order)


def batch_indices(seed, dataset_size, batch_size, step):
    """The training split's indices that step `step` (0-based) of a job with
    `seed` and `batchSize` takes, in order, from a training split of
    `dataset_size` samples."""
    if dataset_size <= 0 or batch_size <= 0 or step < 0:
        raise ValueError("dataset_size and batch_size must be positive and "
                         "step at least 0")
    out, epoch, order = [], -1, None
    for g in range(step * batch_size, (step + 1) * batch_size):
        if g // dataset_size != epoch:
            epoch = g // dataset_size
            order = _epoch_order(seed, dataset_size, epoch)
        out.append(order[g % dataset_size])
    return out


def micro_batch_ranges(batch_size, micro_batches):
    """[(begin, end)] of each micro-batch within a step's samples: M
    contiguous runs whose sizes differ by at most one, larger ones first
    (10 into 4: 3, 3, 2, 2)."""
    if not 1 <= micro_batches <= batch_size:
        raise ValueError("micro_batches must be in [1, batch_size]")
    base, extra = divmod(batch_size, micro_batches)
    out, at = [], 0
    for i in range(micro_batches):
        size = base + (1 if i < extra else 0)
        out.append((at, at + size))
        at += size
    return out
