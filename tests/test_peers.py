"""The real peers: sglang 0.5.23's own Triton extend kernel, loaded unmodified from its wheel (on
CPU under TRITON_INTERPRET=1, set in conftest), and FlashMLA on the GPU."""

import math
import zipfile

import pytest
import torch

from specdiag.attention import gather_prefix, make_verify_inputs, peers, relative_error, tree_verify_attention_ref
from specdiag.attention.reference import attend

triton_extend = pytest.importorskip("specdiag.attention.triton_extend")
SCALE = 1 / math.sqrt(192)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_sglang = pytest.mark.skipif(
    peers.sglang_source() is None,
    reason=f"no sglang wheel: pip download --no-deps sglang=={peers.SGLANG_VERSION} -d {peers.CACHE}",
)


@needs_sglang
@pytest.mark.parametrize(
    "lens, nodes, heads, page_size, shape",
    [
        ([45], 9, 2, 16, "random"),
        ([0, 70, 33], 5, 1, 1, "chain"),  # ragged, one request without a prefix
        ([40], 33, 1, 64, "fan"),  # two of the kernel's 32-row query blocks
    ],
)
def test_real_sglang_kernel_matches_reference_and_our_imitation(lens, nodes, heads, page_size, shape):
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32  # the interpreter has no bf16 dot
    x, _ = make_verify_inputs(lens, nodes, heads, page_size=page_size, tree_shape=shape, seed=nodes, dtype=dtype)
    ref_o, ref_l = tree_verify_attention_ref(**x, scale=SCALE)
    xd = {k: v.to(DEV) for k, v in x.items()}
    out, lse = peers.SglangExtend(**xd, scale=SCALE).run()
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert relative_error(out, ref_o) < tol
    assert relative_error(lse, ref_l) < tol
    ours, _ = triton_extend.tree_verify_attention_triton(**xd, scale=SCALE)
    assert relative_error(ours, out.float()) < tol


@needs_sglang
def test_sglang_kernel_is_loaded_unmodified_with_stubbed_engine_imports():
    mod = peers.load_sglang_extend()
    assert mod.__name__ == "sglang.kernels.ops.attention.extend_attention"
    prov = peers.sglang_provenance()
    assert prov["version"] == peers.SGLANG_VERSION and len(prov["sha256"]) == len(peers.SGLANG_FILES)
    src = peers.sglang_source()
    if src.suffix == ".whl":  # byte for byte what the wheel holds
        with zipfile.ZipFile(src) as whl:
            assert mod.__file__.endswith("extend_attention.py")
            assert open(mod.__file__, "rb").read() == whl.read(peers.SGLANG_FILES[0])
    with pytest.raises(AttributeError, match="no environment flag SGLANG_SOMETHING_NEW"):
        peers._Envs().SGLANG_SOMETHING_NEW  # noqa: B018


def test_missing_sglang_sources_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDIAG_SGLANG", str(tmp_path / "nope.whl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        peers.sglang_source()
    with pytest.raises(FileNotFoundError, match="lacks sglang/kernels/ops/attention/extend_attention.py"):
        peers.load_sglang_extend(tmp_path)
    whl = tmp_path / "sglang-0.5.23-x.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("sglang/__init__.py", "")
    with pytest.raises(FileNotFoundError, match="not a sglang 0.5.23 wheel"):
        peers.load_sglang_extend(whl)


def test_flashmla_says_why_it_cannot_run():
    why = peers.flashmla_missing()
    if DEV == "cpu":
        assert why == "no CUDA GPU"
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            peers.FlashMLAPrefix(None, None, None, None, SCALE)


@pytest.mark.gpu
def test_flashmla_prefix_and_cascade_match_reference():
    if peers.flashmla_missing():
        pytest.skip(peers.flashmla_missing())
    x, _ = make_verify_inputs([5000, 300], nodes=9, heads=8, page_size=64, seed=5, device="cuda")
    ref_o, ref_l = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SCALE)
    out, lse = peers.FlashMLACascade(**x, scale=SCALE).run()
    assert relative_error(out.cpu(), ref_o) < 1e-2 and relative_error(lse.cpu(), ref_l) < 1e-3
    o1, l1 = peers.FlashMLAPrefix(x["q"], x["kv_pool"], x["page_table"], x["prefix_lens"], SCALE).run()
    for b in range(2):  # the prefix alone against a float64 softmax over the prefix
        keys = gather_prefix(x["kv_pool"].cpu(), x["page_table"][b].cpu(), int(x["prefix_lens"][b])).double()
        ro, rl = attend(x["q"][b].cpu().double(), keys, SCALE, 512)
        assert relative_error(o1[b].cpu(), ro) < 1e-2 and relative_error(l1[b].cpu(), rl) < 1e-3


def test_sparse_indices_gather_exactly_the_keys_of_the_reference():
    """Attending, per node, to the rows ``sparse_indices`` names in ``sparse_kv``'s array gives the
    float64 reference's tree verify (prefix through an odd page size, ancestor-masked tree)."""
    x, _ = make_verify_inputs([300], nodes=9, heads=2, page_size=7, seed=11)
    pool, n = x["kv_pool"], int(x["prefix_lens"][0])
    kv = peers.sparse_kv(pool, x["tree_kv"][0])
    idx = peers.sparse_indices(x["page_table"][0], n, 7, pool.shape[0] * 7, x["tree_mask"][0])
    assert idx.dtype == torch.int32 and idx.shape == (9, 384) and (idx[:, n + 9 :] == -1).all()
    ref_o, ref_l = tree_verify_attention_ref(**x, scale=SCALE)
    for i in range(9):
        keys = kv[idx[i][idx[i] >= 0].long(), 0].double()
        o, lse = attend(x["q"][0, i : i + 1].double(), keys, SCALE, 512)
        assert relative_error(o[0], ref_o[0, i]) < 1e-12 and relative_error(lse[0], ref_l[0, i]) < 1e-12


def test_the_sparse_peer_is_a_page_size_1_peer_of_64_head_blocks():
    from specdiag.bench.peers import PEER_IMPLS, shape_unsupported

    assert PEER_IMPLS["flashmla_sparse"] == 1
    assert "blocks of 64" in shape_unsupported("flashmla_sparse", 8, 9)
    assert shape_unsupported("flashmla_sparse", 128, 65) is None and shape_unsupported("native", 8, 9) is None


def test_bench_peers_refuses_heads_and_trees_it_has_no_shape_for(tmp_path, capsys):
    from specdiag.bench.__main__ import main as bench_main

    out = tmp_path / "p.json"
    assert bench_main(["peers", "--heads", "64", "--trees", "257", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("no peers shape") and not out.exists()
    assert bench_main(["peers", "--heads", "sixty-four", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bad --contexts, --heads or --trees") and not out.exists()


def test_peer_names_take_one_registry_kernel_at_page_size_1():
    from specdiag.bench.peers import peer_page_size

    assert peer_page_size("native") == 1 and peer_page_size("native_ps64") == 64 and peer_page_size("flashmla") == 64
    assert peer_page_size("native:wgmma_wide") == 1 and peer_page_size("native:mma_small") == 1
    for bad in ("native:wide", "native:", "flash_mla", "native_wgmma_wide"):
        with pytest.raises(ValueError, match="unknown implementation"):
            peer_page_size(bad)


@pytest.mark.parametrize("peers_arg", ["native:wgmma_wid", "flashmla,sglng"])
def test_bench_peers_refuses_an_unknown_peer_in_one_line(peers_arg, tmp_path, capsys):
    from specdiag.bench.__main__ import main as bench_main

    out = tmp_path / "p.json"
    assert bench_main(["peers", "--peers", peers_arg, "--heads", "8", "--trees", "9", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bad --peers: unknown implementation") and not out.exists()


@pytest.mark.gpu
def test_flashmla_sparse_verify_matches_reference():
    """FlashMLA's sparse prefill as the page-size-1 peer: the whole tree verify against float64."""
    if peers.flashmla_missing():
        pytest.skip(peers.flashmla_missing())
    for ps, heads in ((1, 64), (7, 128)):
        x, _ = make_verify_inputs([5000], nodes=9, heads=heads, page_size=ps, seed=ps, device="cuda")
        ref_o, ref_l = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SCALE)
        out, lse = peers.FlashMLASparseVerify(**x, scale=SCALE).run()
        assert relative_error(out.cpu(), ref_o) < 1e-2 and relative_error(lse.cpu(), ref_l) < 1e-3
    with pytest.raises(ValueError, match="blocks of 64"):
        peers.FlashMLASparseVerify(**make_verify_inputs([100], 9, 8, page_size=1, device="cuda")[0], scale=SCALE)


@needs_sglang
def test_sglang_tile_is_read_from_its_source_and_leaves_the_module_as_it_was():
    mod = peers.load_sglang_extend()
    before = (mod._is_cuda, vars(mod).get("CUDA_CAPABILITY"))
    assert peers.sglang_tile((9, 0)) == dict(block_m=32, block_n=64, num_warps=8)
    assert peers.sglang_tile((12, 0)) == dict(block_m=32, block_n=32, num_warps=8)
    assert (mod._is_cuda, vars(mod).get("CUDA_CAPABILITY")) == before


@pytest.mark.parametrize("asked", ["native,flashmla", "native,sglang"])
def test_bench_peers_records_sglang_only_when_it_ran(asked, tmp_path, monkeypatch):
    """A sweep without sglang (not asked for, or missing here) saves its rows with no sglang metadata."""
    import json

    import specdiag.attention.peers as attention_peers
    import specdiag.bench.__main__ as bench
    import specdiag.bench.peers as bench_peers
    from specdiag.bench import timing

    def sweep(contexts, shapes, impls, rep_ms, progress=print, rounds=2):
        missing = {"sglang": "no wheel here"} if "sglang" in impls else {}
        rows = [
            dict(impl=i, context=c, heads=h, nodes=t, page_size=1, ms=1.0)
            for i in impls
            if i not in missing
            for c in contexts
            for h, t in shapes
        ]
        return rows, missing

    monkeypatch.setattr(bench, "gpu_available", lambda: True)
    monkeypatch.setattr(bench_peers, "peer_sweep", sweep)
    monkeypatch.setattr(timing, "measure_ceilings", lambda *a, **k: {"copy_tb_s": 1.0})
    monkeypatch.setattr(attention_peers, "sglang_source", lambda *a, **k: None)  # provenance would fail
    out = tmp_path / "p.json"
    args = ["peers", "--peers", asked, "--heads", "8", "--trees", "9", "--contexts", "32768", "--out", str(out)]
    assert bench.main(args) == 0
    rec = json.loads(out.read_text())
    assert "sglang" not in rec and [r["impl"] for r in rec["rows"]] == ["native"] + (
        ["flashmla"] if "flashmla" in asked else []
    )
    assert rec["missing"] == ({"sglang": "no wheel here"} if "sglang" in asked else {})


@pytest.mark.parametrize("mode", ["peers", "sweep"])
def test_a_cut_off_run_keeps_its_contexts_and_says_it_was_cut_off(monkeypatch, tmp_path, mode):
    """The CLI saves after each context: a run stopped in its second context leaves the first
    context's rows in a recording marked partial, which provenance reports; a whole run is unmarked."""
    import json

    import specdiag.bench.__main__ as bench
    import specdiag.bench.peers as bench_peers
    from specdiag import data
    from specdiag.bench import timing

    def rows_for(contexts):
        if 65536 in contexts and stop["now"]:
            raise KeyboardInterrupt  # the run cut off in its second context
        return [dict(impl="native", context=c, heads=8, nodes=9, page_size=1, ms=1.0) for c in contexts]

    stop = {"now": True}
    monkeypatch.setattr(bench, "gpu_available", lambda: True)
    monkeypatch.setattr(bench_peers, "peer_sweep", lambda contexts, **k: (rows_for(contexts), {}))
    monkeypatch.setattr(timing, "context_sweep", lambda contexts, **k: rows_for(contexts))
    monkeypatch.setattr(timing, "measure_ceilings", lambda *a, **k: {"copy_tb_s": 1.0})
    out = tmp_path / "r.json"
    args = [mode, "--heads", "8", "--trees", "9", "--contexts", "32768,65536", "--out", str(out)]
    args += ["--peers", "native"] if mode == "peers" else ["--impls", "native"]
    with pytest.raises(KeyboardInterrupt):
        bench.main(args)
    rec = json.loads(out.read_text())
    assert [r["context"] for r in rec["rows"]] == [32768]
    assert rec["partial"] == {"contexts_done": [32768], "contexts": [32768, 65536]}
    assert data.provenance(rec).endswith(", cut off after 1 of 2 contexts")
    stop["now"] = False
    assert bench.main(args) == 0
    rec = json.loads(out.read_text())
    assert [r["context"] for r in rec["rows"]] == [32768, 65536] and "partial" not in rec
    assert "cut off" not in data.provenance(rec)


def test_bench_peers_names_a_missing_peer_once(monkeypatch, tmp_path, capsys):
    import specdiag.bench.__main__ as bench
    import specdiag.bench.peers as bench_peers
    from specdiag.bench import timing

    def sweep(contexts, shapes, impls, rep_ms, progress=print, rounds=2):
        progress("sglang: not measured (no wheel here)")
        return [dict(impl="native", context=c, heads=8, nodes=9, page_size=1, ms=1.0) for c in contexts], {
            "sglang": "no wheel here"
        }

    monkeypatch.setattr(bench, "gpu_available", lambda: True)
    monkeypatch.setattr(bench_peers, "peer_sweep", sweep)
    monkeypatch.setattr(timing, "measure_ceilings", lambda *a, **k: {"copy_tb_s": 1.0})
    args = ["peers", "--peers", "native,sglang", "--heads", "8", "--trees", "9", "--contexts", "4096,32768"]
    assert bench.main([*args, "--out", str(tmp_path / "p.json")]) == 0
    assert capsys.readouterr().out.count("sglang: not measured") == 1


def test_bench_peers_takes_its_rounds_and_records_them(monkeypatch, tmp_path, capsys):
    """--rounds reaches the sweep and the recording's head; fewer than one is a one-line error."""
    import json

    import specdiag.bench.__main__ as bench
    import specdiag.bench.peers as bench_peers
    from specdiag.bench import timing

    asked = []

    def sweep(contexts, shapes, impls, rep_ms, progress=print, rounds=2):
        asked.append(rounds)
        return [dict(impl="native", context=c, heads=8, nodes=9, page_size=1, ms=1.0) for c in contexts], {}

    monkeypatch.setattr(bench, "gpu_available", lambda: True)
    monkeypatch.setattr(bench_peers, "peer_sweep", sweep)
    monkeypatch.setattr(timing, "measure_ceilings", lambda *a, **k: {"copy_tb_s": 1.0})
    out = tmp_path / "p.json"
    args = ["peers", "--peers", "native", "--heads", "8", "--trees", "9", "--contexts", "4096", "--out", str(out)]
    assert bench.main([*args, "--rounds", "0"]) == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == "bad --rounds: at least 1, got 0"
    assert bench.main([*args, "--rounds", "3"]) == 0
    assert asked == [3] and json.loads(out.read_text())["rounds"] == 3


def test_peer_sweep_alternates_its_rounds_and_keeps_the_fastest(monkeypatch):
    """Each shape's impls, of both page sizes, are timed in rounds in one order, reversed every
    other round: ours first, then FlashMLA's prefix call, so the two sit side by side in every
    round. A row keeps every timing and the fastest as its ms, and each whole verify is compared
    with the native verify on its own page size's inputs."""
    from types import SimpleNamespace

    import specdiag.bench.peers as bench_peers

    clock = iter(range(100, 0, -1))  # each timing faster than the one before
    pools = []

    def rotation(ctx, ps, *a, **k):
        pools.append(ps)
        return SimpleNamespace(ps=ps)

    def calls(impl, rot):
        assert rot.ps == {"native": 1, "sglang": 1}.get(impl, 64), impl
        out = torch.ones(2, 3) * (2.0 if impl == "sglang" else 1.0)
        return [lambda: (out,)], {}

    def timed(fns, rep_ms):
        return float(next(clock))

    monkeypatch.setattr(bench_peers, "missing_peers", lambda impls: {})
    monkeypatch.setattr(bench_peers, "Rotation", rotation)
    monkeypatch.setattr(bench_peers, "peer_calls", lambda impl, rot: calls(impl, rot))
    monkeypatch.setattr(bench_peers, "time_rotating", timed)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: SimpleNamespace(L2_cache_size=1 << 20))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    impls = ("flashmla", "sglang", "native", "native_ps64")
    rows, missing = bench_peers.peer_sweep(
        contexts=(4096,), shapes=((8, 9),), impls=impls, rep_ms=1.0, progress=lambda *_: None, rounds=3
    )
    assert missing == {} and pools == [1, 64]
    assert [(r["impl"], r["page_size"]) for r in rows] == [
        ("native", 1),
        ("sglang", 1),
        ("native_ps64", 64),
        ("flashmla", 64),
    ]
    runs = {r["impl"]: r["ms_runs"] for r in rows}
    assert runs == {
        "native": [100.0, 93.0, 92.0],
        "flashmla": [99.0, 94.0, 91.0],
        "native_ps64": [98.0, 95.0, 90.0],
        "sglang": [97.0, 96.0, 89.0],
    }
    assert all(r["ms"] == min(r["ms_runs"]) for r in rows)
    by = {r["impl"]: r for r in rows}
    assert by["sglang"]["rel_diff_native"] > 0.5 and "rel_diff_native" not in by["flashmla"]
    assert by["native_ps64"].keys() == by["native"].keys()  # (each the anchor of its page size)
    with pytest.raises(ValueError, match="rounds"):
        bench_peers.peer_sweep(impls=impls, rounds=0)
