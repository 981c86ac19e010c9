"""DDTree draft trees: build, mask, verify, compact.

A DFlash-style drafter emits, in one forward pass, a distribution for each of the
next ``L`` positions.  DDTree treats those per-position distributions as
independent and keeps the ``budget`` most probable *prefixes* (token sequences of
length 1..L) as a tree rooted at the last committed token.  Because every
log-probability is <= 0, a prefix is never more probable than its parent, so the
top-``budget`` set is closed under taking parents and a best-first search over a
heap finds it exactly, popping parents before children.

Node 0 of every tree is the root (the last committed token, depth 0).  The
budget counts the non-root nodes, so a budget of 8 gives a tree of 9 nodes.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch

__all__ = [
    "DraftTree",
    "VerifyResult",
    "build_ddtree",
    "chain_tree",
    "random_tree",
    "verify_greedy",
    "verify_sample",
    "compaction_indices",
    "apply_compaction",
]


@dataclass
class DraftTree:
    """A draft tree in pop order: every parent index is smaller than its child's."""

    tokens: torch.Tensor  # int64 [N]
    parents: torch.Tensor  # int64 [N], -1 for the root
    depths: torch.Tensor  # int64 [N]
    scores: torch.Tensor  # float64 [N], cumulative draft log-probability (root 0)
    _children: list[dict[int, int]] = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = self.tokens.numel()
        if n < 1:
            raise ValueError("a draft tree needs at least the root node")
        for name in ("parents", "depths", "scores"):
            if getattr(self, name).numel() != n:
                raise ValueError(f"tree field {name!r} has {getattr(self, name).numel()} entries, expected {n}")
        if int(self.parents[0]) != -1 or int(self.depths[0]) != 0:
            raise ValueError("node 0 must be the root (parent -1, depth 0)")
        par = self.parents.tolist()
        dep = self.depths.tolist()
        for i in range(1, n):
            p = par[i]
            if not 0 <= p < i:
                raise ValueError(f"node {i} has parent {p}; parents must precede children")
            if dep[i] != dep[p] + 1:
                raise ValueError(f"node {i} has depth {dep[i]} but its parent has depth {dep[p]}")
        children: list[dict[int, int]] = [dict() for _ in range(n)]
        tok = self.tokens.tolist()
        for i in range(1, n):
            if tok[i] in children[par[i]]:
                raise ValueError(f"node {par[i]} has two children with token {tok[i]}")
            children[par[i]][tok[i]] = i
        self._children = children

    @property
    def num_nodes(self) -> int:
        return self.tokens.numel()

    @property
    def budget(self) -> int:
        return self.num_nodes - 1

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def children(self, node: int) -> dict[int, int]:
        """Map token -> child node index."""
        return self._children[node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` (both included)."""
        path = []
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return path[::-1]

    def ancestor_mask(self, device=None) -> torch.Tensor:
        """Bool [N, N]: ``mask[i, j]`` is True when node j is node i or one of its ancestors."""
        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[0, 0] = True
        par = self.parents.tolist()
        for i in range(1, n):  # parents precede children, so the parent's row is final
            mask[i] = mask[par[i]]
            mask[i, i] = True
        return mask.to(device) if device is not None else mask

    def position_ids(self, start: int) -> torch.Tensor:
        """RoPE positions of the nodes when the root sits at position ``start``."""
        if start < 0:
            raise ValueError(f"start position must be >= 0, got {start}")
        return self.depths + int(start)


def _check_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
        raise ValueError("draft log-probabilities must be a 2-D tensor [positions, vocab]")
    if logprobs.shape[0] < 1 or logprobs.shape[1] < 1:
        raise ValueError(f"draft log-probabilities must be non-empty, got shape {tuple(logprobs.shape)}")
    lp = logprobs.detach().to(torch.float64).cpu()
    if torch.isnan(lp).any():
        raise ValueError("draft log-probabilities contain NaN")
    if (lp > 1e-6).any():
        raise ValueError("draft log-probabilities must be <= 0 (pass log_softmax(logits), not logits)")
    return lp


def build_ddtree(logprobs: torch.Tensor, budget: int, root_token: int = 0, top_k: int | None = None) -> DraftTree:
    """Best-first DDTree construction.

    ``logprobs[d, v]`` is the drafter's log-probability of token ``v`` at depth
    ``d + 1``.  Returns the ``budget`` most probable prefixes (fewer if the
    search space is smaller) as a :class:`DraftTree` in pop order.

    The heap holds, for every expanded node, only its next-best unexpanded
    child, so the search costs O(budget log budget) after one sort per depth.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"node budget must be an integer >= 1, got {budget!r}")
    lp = _check_logprobs(logprobs)
    depth_max, vocab = lp.shape
    k = vocab if top_k is None else int(top_k)
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    k = min(k, vocab)
    sorted_lp, order = torch.sort(lp, dim=1, descending=True)
    sorted_lp = sorted_lp[:, :k].tolist()
    order = order[:, :k].tolist()

    tokens, parents, depths, scores = [int(root_token)], [-1], [0], [0.0]
    tie = itertools.count()
    # entries: (-score, tiebreak, parent node, depth of the candidate (1-based), rank)
    heap = [(-sorted_lp[0][0], next(tie), 0, 1, 0)]
    while heap and len(tokens) - 1 < budget:
        neg, _, parent, d, r = heapq.heappop(heap)
        score = -neg
        if score == float("-inf"):
            break  # only impossible continuations remain
        node = len(tokens)
        tokens.append(order[d - 1][r])
        parents.append(parent)
        depths.append(d)
        scores.append(score)
        if r + 1 < k:  # next sibling under the same parent
            heapq.heappush(heap, (-(scores[parent] + sorted_lp[d - 1][r + 1]), next(tie), parent, d, r + 1))
        if d < depth_max:  # best child of the new node
            heapq.heappush(heap, (-(score + sorted_lp[d][0]), next(tie), node, d + 1, 0))
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.int64),
        parents=torch.tensor(parents, dtype=torch.int64),
        depths=torch.tensor(depths, dtype=torch.int64),
        scores=torch.tensor(scores, dtype=torch.float64),
    )


def chain_tree(tokens: list[int] | torch.Tensor, root_token: int = 0) -> DraftTree:
    """A single chain (classic speculative decoding): root -> t1 -> t2 -> ..."""
    toks = [int(root_token)] + [int(t) for t in tokens]
    n = len(toks)
    return DraftTree(
        tokens=torch.tensor(toks, dtype=torch.int64),
        parents=torch.arange(-1, n - 1, dtype=torch.int64),
        depths=torch.arange(n, dtype=torch.int64),
        scores=torch.zeros(n, dtype=torch.float64),
    )


def random_tree(num_nodes: int, generator: torch.Generator | None = None, shape: str = "random") -> DraftTree:
    """A tree of ``num_nodes`` nodes (root included) for tests and benchmarks.

    ``shape``: ``"chain"`` (one path), ``"fan"`` (every node a child of the root)
    or ``"random"`` (each node's parent drawn uniformly from earlier nodes).
    Tokens are node indices, so siblings never collide.
    """
    if num_nodes < 1:
        raise ValueError(f"a tree needs >= 1 node, got {num_nodes}")
    if shape == "chain":
        parents = list(range(-1, num_nodes - 1))
    elif shape == "fan":
        parents = [-1] + [0] * (num_nodes - 1)
    elif shape == "random":
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, num_nodes)]
    else:
        raise ValueError(f"unknown tree shape {shape!r}; use 'chain', 'fan' or 'random'")
    depths = [0] * num_nodes
    for i in range(1, num_nodes):
        depths[i] = depths[parents[i]] + 1
    return DraftTree(
        tokens=torch.arange(num_nodes, dtype=torch.int64),
        parents=torch.tensor(parents, dtype=torch.int64),
        depths=torch.tensor(depths, dtype=torch.int64),
        scores=torch.zeros(num_nodes, dtype=torch.float64),
    )


@dataclass
class VerifyResult:
    accepted_nodes: list[int]  # non-root nodes on the accepted path, root excluded
    accepted_tokens: list[int]  # their tokens
    bonus_token: int  # the target's own token after the last accepted node

    @property
    def commit_length(self) -> int:
        """Tokens committed this step: the accepted drafts plus the bonus token."""
        return len(self.accepted_nodes) + 1

    @property
    def committed_tokens(self) -> list[int]:
        return self.accepted_tokens + [self.bonus_token]

    @property
    def last_node(self) -> int:
        return self.accepted_nodes[-1] if self.accepted_nodes else 0


def _check_target_logits(tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2 or logits.shape[0] != tree.num_nodes:
        raise ValueError(f"target logits must be [num_nodes={tree.num_nodes}, vocab], got {tuple(logits.shape)}")
    return logits


def _walk(tree: DraftTree, pick) -> VerifyResult:
    node, accepted = 0, []
    while True:
        tok = pick(node)
        child = tree.children(node).get(tok)
        if child is None:
            return VerifyResult(accepted, [int(tree.tokens[i]) for i in accepted], tok)
        accepted.append(child)
        node = child


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy verification: follow the target's argmax down the tree.

    ``target_logits[i]`` is the target's prediction for the token after node i's
    prefix.  The committed tokens equal what greedy decoding of the target would
    produce, whatever the tree holds.
    """
    logits = _check_target_logits(tree, target_logits)
    argmax = logits.argmax(dim=-1).tolist()
    return _walk(tree, lambda node: argmax[node])


def verify_sample(
    tree: DraftTree,
    target_logits: torch.Tensor,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Lossless sampling verification for a deterministic draft tree.

    At each accepted node a token is sampled from the target's own distribution;
    the walk continues if some child carries that token.  Every committed token
    is therefore an exact sample of the target, whatever the tree holds.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use verify_greedy for greedy), got {temperature}")
    logits = _check_target_logits(tree, target_logits)
    probs = torch.softmax(logits.detach().double().cpu() / temperature, dim=-1)
    return _walk(tree, lambda node: int(torch.multinomial(probs[node], 1, generator=generator)))


def compaction_indices(
    tree: DraftTree, result: VerifyResult | list[int], prefix_len: int, tree_base: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slots to move after verification.

    During verification node i's KV was written at slot ``tree_base + i``
    (default ``prefix_len + i``).  The root and the accepted nodes must end up
    contiguous at ``prefix_len + depth``.  Returns ``(src, dst)`` int64 tensors,
    root first.
    """
    nodes = result.accepted_nodes if isinstance(result, VerifyResult) else list(result)
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    base = prefix_len if tree_base is None else int(tree_base)
    path = [0] + nodes
    for a, b in zip(path, path[1:]):
        if not 0 <= b < tree.num_nodes or int(tree.parents[b]) != a:
            raise ValueError(f"accepted nodes {nodes} are not a root path of the tree")
    src = torch.tensor([base + i for i in path], dtype=torch.int64)
    dst = torch.tensor([prefix_len + int(tree.depths[i]) for i in path], dtype=torch.int64)
    return src, dst


def apply_compaction(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Move ``kv[src]`` to ``kv[dst]`` along dim 0, in place (gather first, so overlaps are safe)."""
    if src.shape != dst.shape:
        raise ValueError("src and dst must have the same shape")
    if src.numel() and (int(src.max()) >= kv.shape[0] or int(dst.max()) >= kv.shape[0] or int(src.min()) < 0):
        raise ValueError(f"compaction index out of range for a KV buffer of {kv.shape[0]} slots")
    rows = kv.index_select(0, src.to(kv.device))
    kv.index_copy_(0, dst.to(kv.device), rows)
    return kv
