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


def test_draft_tokens_as_a_list_or_a_tensor_give_one_verdict():
    """The engine hands verify_greedy its draft as a list (no tensor made at each step)."""
    gen = torch.Generator().manual_seed(3)
    for k in range(6):
        logits = torch.randn(k + 1, 50, generator=gen)
        targets = torch.argmax(logits, dim=-1).tolist()
        for draft in (targets[:k], [(t + 1) % 50 for t in targets[:k]], targets[: k // 2] + [0] * (k - k // 2)):
            as_list = verify_greedy(draft, logits)
            assert as_list == verify_greedy(torch.tensor(draft, dtype=torch.long), logits)
            assert type(as_list.next_token) is int and as_list.next_token == targets[as_list.num_accepted]


def test_greedy_ties_go_to_lowest_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    v = verify_greedy(torch.tensor([2]), logits)
    assert (v.num_accepted, v.next_token) == (0, 1)


def test_greedy_token_is_torchs_argmax_on_every_path():
    """The fast CPU float32 path (numpy) answers what torch.argmax does: ties to the lowest id, a NaN counted as
    the maximum, one id per row, a 0-d tensor for one row; other dtypes take torch's own path."""
    from spekula.sampling import greedy_ids, greedy_token

    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0))
    logits[1, 9] = logits[1, 5] = 1e9  # a tie: 5 wins
    logits[2, 8] = logits[2, 7] = float("nan")  # the first NaN wins
    logits[3] = 0.0  # all equal: 0
    for x in (logits, logits[:, ::2], logits.to(torch.bfloat16), logits.double()):
        assert torch.equal(greedy_token(x), torch.argmax(x, dim=-1)) and greedy_token(x).dtype == torch.long
        assert greedy_ids(x) == torch.argmax(x, dim=-1).tolist()
    assert greedy_token(logits).tolist()[1:] == [5, 7, 0]
    assert greedy_token(logits[0]).shape == () and int(greedy_token(logits[0])) == int(torch.argmax(logits[0]))
