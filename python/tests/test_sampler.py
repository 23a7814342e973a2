"""gpipe.sampler against the C++ sampler: batches pinned on both sides, a
micro-batch split as SplitMicroBatches makes it, epochs that are
permutations. tests/scripts/torch_parity_test.sh shows it end to end: its
PyTorch loop takes its batches from batch_indices and ends at gpipectl's
weights."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir))

from gpipe import sampler  # noqa: E402


class SamplerTest(unittest.TestCase):
    def test_batches_are_the_cpp_samplers(self):
        # tests/unit/data_sampler_test.cc (BatchesArePinned) pins the same.
        self.assertEqual([sampler.batch_indices(3, 10, 4, s) for s in range(4)],
                         [[5, 4, 0, 7], [1, 2, 8, 3], [6, 9, 9, 6],
                          [7, 0, 3, 8]])
        self.assertEqual(sampler.batch_indices(2**64 - 1, 7, 5, 3),
                         [3, 6, 4, 0, 5])

    def test_micro_batches_are_contiguous_larger_first(self):
        self.assertEqual(sampler.micro_batch_ranges(10, 4),
                         [(0, 3), (3, 6), (6, 8), (8, 10)])
        self.assertEqual(sampler.micro_batch_ranges(128, 8)[-1], (112, 128))
        with self.assertRaises(ValueError):
            sampler.micro_batch_ranges(4, 5)

    def test_epochs_are_permutations_and_steps_cross_them(self):
        first = sampler.epoch_order(3, 10, 0)
        self.assertEqual(sorted(first), list(range(10)))
        self.assertNotEqual(first, sampler.epoch_order(3, 10, 1))
        self.assertNotEqual(first, sampler.epoch_order(4, 10, 0))
        # Step 2 of batches of 4 takes the first epoch's last 2 and the
        # second's first 2.
        self.assertEqual(sampler.batch_indices(3, 10, 4, 2),
                         first[8:] + sampler.epoch_order(3, 10, 1)[:2])
        with self.assertRaises(ValueError):
            sampler.batch_indices(3, 0, 4, 0)


if __name__ == "__main__":
    unittest.main()
