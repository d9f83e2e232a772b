"""core/tensors.py: the one trailing-pad rule, the one eos-id rule, and padding."""

import torch

from steer_hydra.core.tensors import eos_ids, left_pack, pad_left, pad_right, strip_trailing


def test_strip_trailing_drops_only_trailing_pads():
    assert strip_trailing([5, 0, 7, 0, 0], 0) == ([5, 0, 7], True)
    assert strip_trailing([5, 7], 0) == ([5, 7], False)
    assert strip_trailing([0, 0], 0) == ([], True)
    assert strip_trailing([3, 0], None) == ([3, 0], False)


def test_eos_ids_flattens_and_deduplicates_in_order():
    assert eos_ids(2, [7, 2, None], None, (9,)) == [2, 7, 9]
    assert eos_ids(None) == []


def test_pad_left_then_left_pack_round_trip():
    ids, mask = pad_left([[4, 5], [6]], 0)
    assert ids.tolist() == [[4, 5], [0, 6]] and mask.tolist() == [[1, 1], [0, 1]]
    packed, packed_mask = left_pack(torch.tensor([[4, 0], [6, 7]]), torch.tensor([[1, 0], [1, 1]]), 0)
    assert packed.tolist() == [[0, 4], [6, 7]] and packed_mask.tolist() == [[0, 1], [1, 1]]


def test_pad_right_concatenates_ragged_blocks():
    out = pad_right([torch.tensor([[1, 2, 3]]), torch.tensor([[4]])], 9)
    assert out.tolist() == [[1, 2, 3], [4, 9, 9]]
