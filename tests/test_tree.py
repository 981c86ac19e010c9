import itertools
import math

import pytest
import torch

from specdiag.tree import (
    DraftTree,
    apply_compaction,
    build_ddtree,
    chain_tree,
    compaction_indices,
    random_tree,
    verify_greedy,
    verify_sample,
)


def brute_force_top(logprobs: torch.Tensor, budget: int) -> list[float]:
    """Scores of the `budget` most probable prefixes by full enumeration."""
    depth, vocab = logprobs.shape
    lp = logprobs.double().tolist()
    scores = []
    for d in range(1, depth + 1):
        for seq in itertools.product(range(vocab), repeat=d):
            scores.append(sum(lp[i][t] for i, t in enumerate(seq)))
    return sorted(scores, reverse=True)[:budget]


@pytest.mark.parametrize("seed", range(12))
def test_builder_matches_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    depth = int(torch.randint(1, 5, (1,), generator=g))
    vocab = int(torch.randint(2, 6, (1,), generator=g))
    total = sum(vocab**d for d in range(1, depth + 1))
    budget = int(torch.randint(1, total + 3, (1,), generator=g))  # sometimes more than exists
    lp = torch.log_softmax(torch.randn(depth, vocab, generator=g) * 2, -1)
    tree = build_ddtree(lp, budget, root_token=7)
    want = brute_force_top(lp, budget)
    got = sorted(tree.scores[1:].tolist(), reverse=True)
    assert len(got) == min(budget, total)
    assert got == pytest.approx(want, abs=1e-12)
    # each node's score is its parent's plus the token's log-prob at its depth
    for i in range(1, tree.num_nodes):
        p, d, t = int(tree.parents[i]), int(tree.depths[i]), int(tree.tokens[i])
        assert p < i
        assert tree.scores[i].item() == pytest.approx(tree.scores[p].item() + lp[d - 1, t].item(), abs=1e-12)
    # pop order: scores never increase
    assert all(a >= b - 1e-12 for a, b in zip(tree.scores[1:].tolist(), tree.scores[2:].tolist()))
    assert int(tree.tokens[0]) == 7


def test_top_k_limits_children():
    lp = torch.log_softmax(torch.randn(3, 10), -1)
    tree = build_ddtree(lp, 50, top_k=2)
    for i in range(tree.num_nodes):
        assert len(tree.children(i)) <= 2
    assert tree.num_nodes - 1 == 2 + 4 + 8  # the whole top-2 space is smaller than the budget


def test_ancestor_mask_and_positions():
    tree = random_tree(40, generator=torch.Generator().manual_seed(3))
    mask = tree.ancestor_mask()
    for i in range(tree.num_nodes):
        want = torch.zeros(tree.num_nodes, dtype=torch.bool)
        want[tree.path_to(i)] = True
        assert torch.equal(mask[i], want)
    assert torch.equal(tree.position_ids(100), tree.depths + 100)
    with pytest.raises(ValueError):
        tree.position_ids(-1)


class ToyTarget:
    """A deterministic 'language model': next-token logits depend on the last two tokens."""

    def __init__(self, vocab=6, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, vocab, generator=g) * 3

    def logits(self, seq):
        a = seq[-2] if len(seq) > 1 else 0
        return self.table[a, seq[-1]]

    def greedy(self, seq, n):
        seq = list(seq)
        for _ in range(n):
            seq.append(int(self.logits(seq).argmax()))
        return seq[-n:]


def tree_logits(target, prefix, tree):
    return torch.stack(
        [target.logits(prefix + [int(tree.tokens[j]) for j in tree.path_to(i)]) for i in range(tree.num_nodes)]
    )


@pytest.mark.parametrize("seed", range(5))
def test_greedy_verify_is_lossless(seed):
    target = ToyTarget(seed=seed)
    g = torch.Generator().manual_seed(seed)
    seq = [1, 2]
    produced = []
    while len(produced) < 30:
        lp = torch.log_softmax(torch.randn(4, 6, generator=g), -1)
        tree = build_ddtree(lp, 12, root_token=seq[-1])
        res = verify_greedy(tree, tree_logits(target, seq[:-1], tree))
        assert res.commit_length == len(res.accepted_nodes) + 1
        produced += res.committed_tokens
        seq += res.committed_tokens
    assert produced[:30] == target.greedy([1, 2], 30)


def test_greedy_accepts_a_perfect_draft():
    target = ToyTarget(seed=1)
    want = target.greedy([3, 4], 5)
    tree = chain_tree(want[:4], root_token=4)
    res = verify_greedy(tree, tree_logits(target, [3], tree))
    assert res.accepted_tokens == want[:4]
    assert res.bonus_token == want[4]
    assert res.commit_length == 5


def test_sampling_verify_matches_target_distribution():
    # first committed token must follow the target's softmax, whatever the tree holds
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    tree = chain_tree([0, 1])  # the draft proposes token 0 first
    full = torch.stack([logits, logits, logits])
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.zeros(4)
    for _ in range(n):
        r = verify_sample(tree, full, generator=g)
        counts[r.committed_tokens[0]] += 1
    p = torch.softmax(logits, 0)
    assert torch.allclose(counts / n, p, atol=4 * math.sqrt(0.25 / n))
    with pytest.raises(ValueError):
        verify_sample(tree, full, temperature=0)


def test_compaction_moves_accepted_path():
    tree = DraftTree(
        tokens=torch.tensor([9, 1, 2, 3, 4]),
        parents=torch.tensor([-1, 0, 0, 2, 3]),
        depths=torch.tensor([0, 1, 1, 2, 3]),
        scores=torch.zeros(5, dtype=torch.float64),
    )
    src, dst = compaction_indices(tree, [2, 3, 4], prefix_len=10)
    assert src.tolist() == [10, 12, 13, 14]
    assert dst.tolist() == [10, 11, 12, 13]
    kv = torch.arange(20.0).view(-1, 1).repeat(1, 3)
    apply_compaction(kv, src, dst)
    assert kv[10:14, 0].tolist() == [10.0, 12.0, 13.0, 14.0]
    with pytest.raises(ValueError, match="root path"):
        compaction_indices(tree, [1, 3], prefix_len=10)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: build_ddtree(torch.log_softmax(torch.randn(2, 3), -1), 0), "budget"),
        (lambda: build_ddtree(torch.randn(2, 3).abs() + 0.1, 4), "<= 0"),
        (lambda: build_ddtree(torch.full((2, 3), float("nan")), 4), "NaN"),
        (lambda: build_ddtree(torch.zeros(3), 4), "2-D"),
        (lambda: random_tree(5, shape="star"), "unknown tree shape"),
        (lambda: verify_greedy(chain_tree([1]), torch.zeros(3, 4)), "num_nodes"),
        (
            lambda: DraftTree(torch.tensor([0, 1]), torch.tensor([-1, 1]), torch.tensor([0, 1]), torch.zeros(2)),
            "parents must precede",
        ),
    ],
)
def test_bad_input_raises_clear_errors(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()
