"""Small target/drafter models: YaRN, caches, the speculative loop (lossless) and faults, on CPU."""

import json
import math

import pytest
import torch

from specdiag.models import specdec
from specdiag.models.corpus import MarkovProse, repeated, training_batch
from specdiag.models.lm import (
    BlockDrafter,
    Drafter,
    DrafterConfig,
    KVCache,
    LMConfig,
    TargetLM,
    block_targets,
    yarn_inv_freq,
)
from specdiag.models.train import (
    TrainSettings,
    extend_target,
    load_models,
    save_model,
    train,
    train_block_head,
    training_stages,
)

# the smallest training run that goes through every stage (target, extension, drafter, block head)
TINY_TRAINING = dict(
    target_steps=2,
    drafter_steps=1,
    block_steps=1,
    batch=4,
    length=64,
    pool=4,
    extend_steps=4,
    extend_batch=2,
    extend_pool=3,
)


def test_yarn_keeps_high_and_interpolates_low_frequencies():
    base, _ = yarn_inv_freq(32, 10000.0, 1.0, 1024)
    inv, mscale = yarn_inv_freq(32, 10000.0, 16.0, 1024)
    assert torch.allclose(inv[0], base[0])  # shortest wavelength untouched
    assert inv[-1].item() == pytest.approx(base[-1].item() / 16, rel=1e-6)  # longest wavelength interpolated
    assert (inv <= base + 1e-12).all() and (inv >= base / 16 - 1e-12).all()
    assert mscale == pytest.approx(0.1 * math.log(16) + 1)
    with pytest.raises(ValueError):
        yarn_inv_freq(32, 10000.0, 0.5, 1024)


def test_corpus():
    g = torch.Generator().manual_seed(0)
    r = repeated(100, 7, 64, g)
    assert torch.equal(r[7:14], r[:7]) and r.numel() == 100
    prose = MarkovProse(64, seed=1)
    s = prose.sample(50, g)
    assert s.shape == (50,) and int(s.max()) < 64
    b = training_batch(prose, 4, 64, g)
    assert b.shape == (4, 64)
    with pytest.raises(ValueError):
        repeated(10, 0, 64, g)


def test_prefill_plus_tree_pass_matches_full_forward():
    torch.manual_seed(0)
    m = TargetLM(LMConfig(vocab=32, dim=64, layers=2, heads=4, ffn=128, train_len=64)).eval()
    x = torch.randint(0, 32, (40,))
    full = m(x[None])[0]
    cache = KVCache(2)
    last = m.prefill(x[:30], cache, max_scores=30 * 8)  # forces several chunks
    assert torch.allclose(last, full[29], atol=1e-4)
    # a chain "tree" of the next 10 tokens must reproduce the causal logits
    from specdiag.tree import chain_tree

    tree = chain_tree(x[31:40].tolist(), root_token=int(x[30]))
    logits, _ = m.forward_tree(tree.tokens, tree.position_ids(30), tree.ancestor_mask(), cache)
    assert torch.allclose(logits, full[30:40], atol=1e-4)


def test_drafter_cache_and_draft_match_its_training_forward():
    torch.manual_seed(0)
    d = Drafter(DrafterConfig(vocab=32, dim=64, layers=2, heads=4, ffn=128, block=4, window=16, train_len=64)).eval()
    win = torch.randint(0, 32, (16,))
    cache = KVCache(2)
    d.extend_cache(win, 100, cache)  # absolute positions differ: rotary attention is relative
    lp = d.draft(116, cache)
    assert cache.length == 16  # the temporary KV of drafted tokens is dropped
    # position j's distribution is the LM's prediction after the greedy tokens before it
    # (the drafted tokens are seen on top of the window: the whole sequence here)
    seq = win.clone()
    for j in range(4):
        want = torch.log_softmax(d(seq[None], window=10**6)[0, -1].float(), -1)
        assert torch.allclose(lp[j], want, atol=1e-4)
        seq = torch.cat([seq, want.argmax().view(1)])
    # the cache keeps only the window
    d.extend_cache(torch.randint(0, 32, (10,)), 116, cache)
    assert cache.length == 16
    with pytest.raises(ValueError, match="empty"):
        d.draft(0, KVCache(2))


def _tiny_block_drafter(seed=0, window=16, block=4):
    torch.manual_seed(seed)
    return BlockDrafter(
        DrafterConfig(vocab=32, dim=64, layers=2, heads=4, ffn=128, block=block, window=window, train_len=64)
    ).eval()


def test_block_targets():
    x = torch.arange(10)[None]
    t = block_targets(x, 3)
    assert t.shape == (1, 10, 3)
    assert t[0, 2].tolist() == [3, 4, 5] and t[0, 7].tolist() == [8, 9, -100] and t[0, 9].tolist() == [-100] * 3


def test_block_drafter_drafts_in_one_pass_matching_its_training_forward(monkeypatch):
    d = _tiny_block_drafter()
    win = torch.randint(0, 32, (16,))
    cache = KVCache(2)
    d.extend_cache(win, 100, cache)
    assert cache.length == 16 and cache.feats.shape == (16, 64) and torch.equal(cache.tokens, win)

    def no_pass(*a, **k):
        raise AssertionError("drafting ran the encoder: not a single block pass")

    monkeypatch.setattr(d, "prefill", no_pass)
    lp = d.draft(116, cache)
    monkeypatch.undo()
    assert lp.shape == (4, 32)
    want = torch.log_softmax(d.block_logits(win[None])[0, -1].float(), -1)  # the last row drafts all 4 positions
    assert torch.allclose(lp, want, atol=1e-5)
    d.extend_cache(torch.randint(0, 32, (10,)), 116, cache)
    assert (
        cache.length == 16 and cache.feats.shape[0] == 16 and cache.tokens.shape[0] == 16
    )  # the window, features included
    with pytest.raises(ValueError, match="empty"):
        d.draft(0, KVCache(2))


def test_block_head_sees_only_its_window():
    """Row p's block depends on tokens p - window + 1 .. p only (nothing later, nothing older)."""
    d = _tiny_block_drafter(window=8)
    x = torch.randint(0, 32, (1, 30))
    base = d.block_logits(x)[0, 20]
    later = x.clone()
    later[0, 21:] = (later[0, 21:] + 1) % 32
    assert torch.allclose(d.block_logits(later)[0, 20], base, atol=1e-5)
    feats = d.hidden(x, window=8)
    older_tokens = x.clone()
    older_tokens[0, :13] = (older_tokens[0, :13] + 1) % 32  # outside the window of row 20 (13 .. 20)
    older_feats = feats.clone()
    older_feats[0, :13] += 1.0
    got = d.block_head(older_feats, older_tokens, 8)[0, 20]
    assert torch.allclose(got, d.block_head(feats, x, 8)[0, 20], atol=1e-5)
    inside = x.clone()
    inside[0, 14] = (inside[0, 14] + 1) % 32  # a value the window does hold
    assert not torch.allclose(d.block_head(feats, inside, 8)[0, 20], base, atol=1e-5)
    with pytest.raises(ValueError, match="do not match"):
        d.block_head(feats, x[:, :5], 8)


def test_drafters_of_a_models_folder():
    d = _tiny_block_drafter()
    both = specdec.drafters_of(d)
    assert list(both) == ["block", "autoregressive"] and both["block"] is d and type(both["autoregressive"]) is Drafter
    assert list(specdec.drafters_of(d, ["autoregressive"])) == ["autoregressive"]
    ar = d.autoregressive()
    assert specdec.drafters_of(ar) == {"autoregressive": ar}
    with pytest.raises(ValueError, match=r"\['block'\] not available from a Drafter"):
        specdec.drafters_of(ar, ["block"])


def test_block_drafter_autoregressive_view():
    d = _tiny_block_drafter()
    ar = d.autoregressive()
    assert type(ar) is Drafter and ar.window == d.window
    win = torch.randint(0, 32, (16,))
    c1, c2 = KVCache(2), KVCache(2)
    d.extend_cache(win, 0, c1)
    ar.extend_cache(win, 0, c2)
    assert torch.allclose(Drafter.draft(d, 16, c1), ar.draft(16, c2), atol=1e-6)  # the same encoder
    assert not torch.allclose(d.draft(16, c1), ar.draft(16, c2), atol=1e-3)  # but the block head drafts differently


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("models")
    train(
        out,
        TrainSettings(target_steps=15, drafter_steps=15, block_steps=15, batch=4, length=160, pool=16),
        device="cpu",
        progress=lambda *_: None,
    )
    # float64: a barely trained model has near-tied logits, and exact-equality checks must not
    # depend on float32 rounding differences between a tree pass and a one-token pass
    return tuple(m.double() for m in load_models(out))


@pytest.mark.parametrize("drafting", ["block", "autoregressive"])
@pytest.mark.parametrize("kind", ["predictable", "prose"])
@pytest.mark.parametrize("fault", list(specdec.FAULTS))
def test_speculative_decoding_is_lossless(tiny_models, kind, fault, drafting):
    target, drafter = tiny_models
    assert isinstance(drafter, BlockDrafter)
    if drafting == "autoregressive":
        drafter = drafter.autoregressive()
    p = specdec.make_prompt(kind, 300, 64, seed=3)
    spec = specdec.speculative_generate(target, drafter, p, 24, budget=8, faults=specdec.FAULTS[fault])
    assert spec.tokens == specdec.greedy_generate(target, p, 24)
    assert all(1 <= c <= drafter.cfg.block + 1 for c in spec.commit_lengths)
    # faults are undone afterwards
    assert drafter.window == drafter.cfg.window and drafter.yarn == drafter.cfg.yarn_factor


def test_perfect_drafter_commits_whole_blocks(tiny_models, monkeypatch):
    """With a drafter that always proposes the target's own greedy continuation, each step commits block + 1."""
    target, drafter = tiny_models
    p = specdec.make_prompt("prose", 200, 64, seed=5)
    want = specdec.greedy_generate(target, p, 40)
    block = drafter.cfg.block

    def oracle(next_pos, cache):
        i = next_pos - p.numel()
        lp = torch.full((block, 64), -30.0)
        for j in range(block):
            lp[j, want[i + j] if i + j < len(want) else 0] = 0.0
        return torch.log_softmax(lp, -1)

    monkeypatch.setattr(drafter, "draft", oracle)
    spec = specdec.speculative_generate(target, drafter, p, 27, budget=8)
    assert spec.tokens == want[:27]
    assert spec.commit_lengths[:3] == [block + 1] * 3


def test_saved_weights_are_small_and_reload(tmp_path):
    train(
        tmp_path,
        TrainSettings(target_steps=1, drafter_steps=1, block_steps=1, batch=2, length=150, pool=4),
        device="cpu",
        progress=lambda *_: None,
    )
    sizes = [p.stat().st_size for p in tmp_path.glob("*.pt")]
    assert len(sizes) == 2 and max(sizes) < 4_000_000
    t, d = load_models(tmp_path)
    assert isinstance(t, TargetLM) and isinstance(d, BlockDrafter)
    with pytest.raises(FileNotFoundError, match="train"):
        load_models(tmp_path / "missing")
    save_model(d.autoregressive(), tmp_path / "drafter.pt")  # an autoregressive drafter loads as one
    assert type(load_models(tmp_path)[1]) is Drafter
    save_model(t, tmp_path / "drafter.pt")
    with pytest.raises(ValueError, match="holds a 'TargetLM'"):
        load_models(tmp_path)


def test_block_stage_on_a_trained_pair(tmp_path):
    """train_block_head: a fresh head on a shipped drafter's encoder; the encoder and the target
    are copied bit for bit, only the head is trained, and the earlier stages' log travels along."""
    common = dict(target_steps=2, drafter_steps=2, block_steps=1, batch=4, length=64, pool=4)
    train(tmp_path / "base", TrainSettings(**common), device="cpu", progress=lambda *_: None)
    t0, d0 = load_models(tmp_path / "base")
    save_model(d0.autoregressive(), tmp_path / "base" / "drafter.pt")  # as the autoregressive drafter shipped before
    log = train_block_head(
        tmp_path / "base",
        tmp_path / "blk",
        TrainSettings(**{**common, "block_steps": 3}),
        device="cpu",
        progress=lambda *_: None,
    )
    assert len(log["drafter_block_loss"]) == 2 and log["extended_from"]["log"]["settings"]["target_steps"] == 2
    t1, d1 = load_models(tmp_path / "blk")
    assert isinstance(d1, BlockDrafter)
    enc0, enc1 = d0.state_dict(), d1.state_dict()
    assert all(torch.equal(enc0[k], enc1[k]) for k in enc0 if not k.startswith("block_head."))
    assert all(torch.equal(a, b) for a, b in zip(t0.state_dict().values(), t1.state_dict().values()))
    assert not torch.equal(enc0["block_head.q.weight"], enc1["block_head.q.weight"])
    assert [st["model"] for st in training_stages(log)] == ["target", "drafter", "drafter_block", "drafter_block"]
    with pytest.raises(ValueError, match="vocabulary"):
        train_block_head(tmp_path / "blk", tmp_path / "x", TrainSettings(**{**common, "vocab": 32}), device="cpu")
    with pytest.raises(ValueError, match="block_steps"):
        TrainSettings(block_steps=0)


def test_long_context_stage(tmp_path, monkeypatch):
    """The extension stage trains on the long rows (alternating with short batches), changes the
    weights and moves YaRN's reference length to the extended one."""
    seen = []
    real_forward = TargetLM.forward

    def spy(self, tokens, window=None):
        seen.append(tokens.shape)
        return real_forward(self, tokens, window)

    monkeypatch.setattr(TargetLM, "forward", spy)
    common = TINY_TRAINING
    log = train(tmp_path / "ext", TrainSettings(extend_length=200, **common), device="cpu", progress=lambda *_: None)
    assert seen[2:6] == [(2, 199), (4, 63), (2, 199), (4, 63)]
    assert len(log["target_extend_loss"]) == 2 and log["settings"]["extend_length"] == 200
    t, _ = load_models(tmp_path / "ext")
    assert t.cfg.train_len == 200
    train(tmp_path / "short", TrainSettings(**common), device="cpu", progress=lambda *_: None)
    t_short, _ = load_models(tmp_path / "short")
    assert t_short.cfg.train_len == 64
    assert not torch.equal(t.head.weight, t_short.head.weight)  # same seed: only the extension differs
    with pytest.raises(ValueError, match="exceed"):
        TrainSettings(length=64, extend_length=64)
    with pytest.raises(ValueError, match=">= 1"):
        TrainSettings(length=64, extend_length=128, extend_steps=0)


def test_extending_a_trained_target_keeps_its_drafter(tmp_path):
    """extend_target: another long-context stage for a shipped target; the drafter is copied
    bit for bit (not retrained), the target changes and its YaRN reference length moves."""
    common = TINY_TRAINING
    train(tmp_path / "base", TrainSettings(extend_length=128, **common), device="cpu", progress=lambda *_: None)
    log = extend_target(
        tmp_path / "base",
        tmp_path / "ext",
        TrainSettings(extend_length=256, **common),
        device="cpu",
        progress=lambda *_: None,
    )
    assert log["extended_from"]["train_len"] == 128 and len(log["target_extend_loss"]) == 2
    assert log["extended_from"]["log"]["settings"]["extend_length"] == 128  # the earlier stages' log travels along
    t0, d0 = load_models(tmp_path / "base")
    t1, d1 = load_models(tmp_path / "ext")
    assert t1.cfg.train_len == 256 and t0.cfg.train_len == 128
    assert all(torch.equal(a, b) for a, b in zip(d0.state_dict().values(), d1.state_dict().values()))
    assert not torch.equal(t0.head.weight, t1.head.weight)
    with pytest.raises(ValueError, match="must exceed the target's training length 256"):
        extend_target(tmp_path / "ext", tmp_path / "x", TrainSettings(extend_length=200, **common), device="cpu")
    with pytest.raises(ValueError, match="needs settings.extend_length"):
        extend_target(tmp_path / "ext", tmp_path / "x", TrainSettings(**common), device="cpu")


def test_bad_prompts():
    with pytest.raises(ValueError):
        specdec.make_prompt("poetry", 10)


def test_continuation_accuracy_scores_each_model(tiny_models):
    target, drafter = tiny_models
    for d in (drafter, drafter.autoregressive()):
        rows = specdec.continuation_accuracy(target, d, contexts=(300,), tail=64)
        assert {r["text"] for r in rows} == {"predictable", "prose"}
        for r in rows:
            keys = ("target_acc", "drafter_acc", "agreement") + (("drafter_block_acc",) if d is drafter else ())
            for k in keys:
                assert 0.0 <= r[k] <= 1.0
            assert r["target_yarn"] == specdec.target_yarn_for(target, 300)
            assert r["drafter"] == specdec.drafter_kind(d)
        assert ("drafter_block_acc" in rows[0]) == (d is drafter)


def test_block_accuracy_counts_every_slot(monkeypatch):
    """drafter_block_acc scores all block slots against the tokens they draft: a block head
    that drafts the truth scores 1, one wrong slot costs exactly 1/block."""
    d = _tiny_block_drafter(window=16, block=4)
    t = TargetLM(LMConfig(vocab=32, dim=64, layers=1, heads=4, ffn=128, train_len=64)).eval()
    prompt = torch.randint(0, 32, (100,), generator=torch.Generator().manual_seed(1))

    def oracle(tokens, window=None, wrong_slot=None):  # knows the prompt, so also the token after the input
        n = tokens.shape[1]
        assert torch.equal(tokens[0], prompt[-n - 1 : -1])
        tg = block_targets(prompt[None, -n - 1 :], 4)[:, :-1].clamp(min=0)
        lg = torch.zeros(1, n, 4, 32).scatter_(-1, tg[..., None], 10.0)
        if wrong_slot is not None:
            lg[..., wrong_slot, :] = lg[..., wrong_slot, :].roll(1, -1)
        return lg

    monkeypatch.setattr(specdec, "make_prompt", lambda kind, n, vocab, seed=0: prompt[:n])
    monkeypatch.setattr(d, "block_logits", oracle)
    row = specdec.continuation_accuracy(t, d, contexts=(100,), kinds=("prose",), tail=32)[0]
    assert row["drafter_acc"] == 1.0 and row["drafter_block_acc"] == 1.0
    monkeypatch.setattr(d, "block_logits", lambda tokens, window=None: oracle(tokens, window, wrong_slot=2))
    row = specdec.continuation_accuracy(t, d, contexts=(100,), kinds=("prose",), tail=32)[0]
    assert row["drafter_acc"] == 1.0 and row["drafter_block_acc"] == pytest.approx(0.75)


def test_recorded_drafter_validation():
    from specdiag import data

    doc = data.load_json("drafter_validation_h200.json")
    assert doc["drafters"] == ["block", "autoregressive"]
    assert doc["lossless"] and all(x["equal"] for x in doc["lossless"])
    assert {x["drafter"] for x in doc["lossless"]} == {"block", "autoregressive"}
    for drafter in doc["drafters"]:
        pred = [r for r in doc["rows"] if r["text"] == "predictable" and r["drafter"] == drafter]
        assert len({r["context"] for r in pred}) == 4
        for ctx in sorted({r["context"] for r in pred}):
            commit = {r["fault"]: r["mean_commit"] for r in pred if r["context"] == ctx}
            assert commit["healthy"] > 7, (drafter, ctx)  # flat: close to the 9 possible at every context (1k .. 128k)
            for fault in ("broken window", "stale draft KV"):
                assert commit[fault] < commit["healthy"] / 2, (drafter, ctx, fault)
            assert commit["wrong YaRN"] <= commit["healthy"], (drafter, ctx)
            if drafter == "autoregressive":
                assert commit["wrong YaRN"] < commit["healthy"], ctx  # a partial drop
        acc = [r for r in doc["accuracy"] if r["text"] == "predictable" and r["drafter"] == drafter]
        assert min(r["drafter_acc"] for r in acc) > 0.95  # the drafter keeps the repeat at every context
        assert min(r["target_acc"] for r in acc) > 0.99  # and so does the target, extended to 64k
        if drafter == "block":
            assert min(r["drafter_block_acc"] for r in acc) > 0.99  # all 8 slots of the one pass


def test_shipped_block_drafter_commits_whole_blocks():
    """Live on CPU at 1k: the shipped block drafter drafts the repeat whole (8 + the bonus
    token per verify step), and a broken window collapses it."""
    from specdiag import data

    t, d = load_models(data.data_dir() / "models")
    p = specdec.make_prompt("predictable", 1024, t.cfg.vocab)
    healthy = specdec.speculative_generate(t, d, p, 36, budget=16)
    assert healthy.commit_lengths == [9] * 4
    assert healthy.tokens == specdec.greedy_generate(t, p, 36)
    assert specdec.speculative_generate(t, d, p, 36, budget=16, faults=specdec.FAULTS["broken window"]).mean_commit < 2


def test_shipped_models_load():
    from specdiag import data

    t, d = load_models(data.data_dir() / "models")
    assert isinstance(d, BlockDrafter) and d.window == 128 and d.cfg.block == 8 and t.cfg.train_len == 65536
    log = json.loads((data.data_dir() / "models" / "train_log.json").read_text())
    # 1k stage, then 16k, then the 64k stage that continued the shipped 16k target, then the block head
    assert log["extended_from"]["train_len"] == 65536 and log["settings"]["block_steps"] == 1000
    assert log["extended_from"]["log"]["settings"]["extend_length"] == 65536
    assert log["extended_from"]["log"]["extended_from"]["train_len"] == 16384
    stages = training_stages(log)
    assert [(st["model"], st["length"]) for st in stages] == [
        ("target", 1024),
        ("target_extend", 16384),
        ("drafter", 1024),
        ("target_extend", 65536),
        ("drafter_block", 1024),
    ]
    assert [st["steps"] for st in stages[-2:]] == [1000, 1000]
