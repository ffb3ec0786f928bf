"""Table-driven greedy verification with hand-built logits."""

import pytest
import torch

from spekula.verify import verify_greedy


def logits_for(argmaxes: list[int], vocab: int = 8) -> torch.Tensor:
    out = torch.zeros(len(argmaxes), vocab)
    for row, token in enumerate(argmaxes):
        out[row, token] = 5.0
    return out


@pytest.mark.parametrize(
    "draft, target_argmax, accepted, next_token",
    [
        ([], [3], 0, 3),  # plain decoding: the bonus token is the argmax
        ([3], [3, 5], 1, 5),  # all accepted -> bonus
        ([3], [4, 5], 0, 4),  # first rejected -> recovered = target argmax
        ([1, 2, 3], [1, 2, 3, 7], 3, 7),
        ([1, 2, 3], [1, 2, 6, 7], 2, 6),
        ([1, 2, 3], [0, 2, 3, 7], 0, 0),  # later matches do not count after a mismatch
        ([1, 1, 1, 1], [1, 1, 1, 1, 1], 4, 1),
    ],
)
def test_greedy_table(draft, target_argmax, accepted, next_token):
    v = verify_greedy(torch.tensor(draft, dtype=torch.long), logits_for(target_argmax))
    assert (v.num_accepted, v.next_token) == (accepted, next_token)
    assert v.bonus == (accepted == len(draft))
    assert v.emitted(draft) == draft[:accepted] + [next_token]


def test_greedy_ties_go_to_lowest_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    v = verify_greedy(torch.tensor([2]), logits)
    assert (v.num_accepted, v.next_token) == (0, 1)
