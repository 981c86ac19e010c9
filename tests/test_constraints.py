"""The source scanner on small synthetic engine trees, and on the recorded sglang scan."""

import textwrap

import pytest

from specdiag import constraints, data


def write(root, rel, src):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(src))


@pytest.fixture
def engine(tmp_path):
    root = tmp_path / "fakeengine"
    write(
        root,
        "server_args.py",
        """
        class ServerArgs:
            def __post_init__(self):
                if self.speculative_algorithm == "DDTREE":
                    if self.page_size != 1:
                        raise ValueError("DDTREE needs page_size == 1: accepted nodes are not contiguous")
                if self.speculative_algorithm in ("EAGLE", "EAGLE3") and self.speculative_eagle_topk > 1:
                    if self.page_size > 1:
                        self.page_size = 1
                if self.page_size == 1:
                    print("unrelated")
    """,
    )
    write(
        root,
        "hooks.py",
        """
        def _handle_ngram(cfg):
            if cfg.topk > 1 and cfg.page_size > 1:
                raise ValueError("unstable")
    """,
    )
    write(
        root,
        "layers/attention/tree_mla_backend.py",
        """
        class TreeMLABackend:
            def forward_extend(self, q, k, v, custom_mask=None):
                return run(q, k, v, mask=custom_mask)
    """,
    )
    write(
        root,
        "layers/attention/triton_backend.py",
        """
        class TritonBackend:
            def __init__(self, cfg):
                self.use_mla = cfg.kv_lora_rank > 0
            def forward_extend(self, batch):
                mask = batch.spec_info.custom_mask
    """,
    )
    write(
        root,
        "layers/attention/fastdecode_backend.py",
        """
        class FastDecode:
            def forward_decode(self, q, k_cache):
                return q
    """,
    )
    write(
        root,
        "model_runner.py",
        """
        def check(self, args):
            if self.use_mla_backend:
                if args.attention_backend in ["fastdecode", "fa3"]:
                    pass
    """,
    )
    write(
        root,
        "tests/test_x.py",
        """
        def test_():
            if page_size != 1:
                raise ValueError("EAGLE in tests")
    """,
    )
    write(root, "broken.py", "def (:\n")  # unparsable files are skipped
    return root


def test_page_size_constraints_found_with_algorithms(engine):
    found = constraints.page_size_constraints(engine)
    by_algo = {tuple(c.algorithms): c for c in found}
    ddtree = by_algo[("DDTREE",)]
    assert ddtree.file == "server_args.py" and ddtree.action == "raise" and "contiguous" in ddtree.message
    assert ddtree.line == 5
    eagle = by_algo[("EAGLE", "EAGLE3")]
    assert eagle.action == "reset page_size" and eagle.tree_drafts
    ngram = by_algo[("NGRAM",)]
    assert ngram.function == "_handle_ngram" and ngram.tree_drafts
    assert all("tests/" not in c.file for c in found)
    assert not any(c.action is None for c in found)
    assert len(found) == 3  # the bare `page_size == 1: print` has no constraint action


def test_backends_mask_and_mla(engine):
    rows = {b.backend: b for b in constraints.backend_masks(engine)}
    assert (
        rows["tree_mla"].accepts_custom_mask and rows["tree_mla"].mla and rows["tree_mla"].mla_evidence == "file name"
    )
    assert rows["triton"].accepts_custom_mask and rows["triton"].mla and "kv_lora_rank" in rows["triton"].mla_evidence
    assert rows["triton"].custom_mask_lines == [6]
    assert not rows["fastdecode"].accepts_custom_mask
    # the engine's own list of valid MLA backends counts as evidence
    assert rows["fastdecode"].mla and rows["fastdecode"].mla_evidence == "listed as an MLA backend at model_runner.py:4"
    assert constraints.declared_mla_backends(engine) == {
        "fastdecode": "model_runner.py:4",
        "flashattention": "model_runner.py:4",
    }


def test_engine_without_constraints(tmp_path):
    root = tmp_path / "clean"
    write(root, "a.py", "def f(page_size):\n    return page_size * 2\n")
    d = constraints.scan_engine(root)
    assert d["page_size_constraints"] == [] and d["backends"] == []
    assert d["version"] == "unknown"


def test_missing_engine_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        constraints.scan_engine(tmp_path / "nope")


def test_version_from_dist_info(engine):
    (engine.parent / "fakeengine-1.2.3.dist-info").mkdir()
    assert constraints.scan_engine(engine)["version"] == "1.2.3"


def test_recorded_sglang_scan_shows_the_story():
    doc = data.load_json("constraints_sglang.json")
    assert len(doc["scans"]) >= 1
    for s in doc["scans"]:
        tree_cons = [c for c in s["page_size_constraints"] if c["tree_drafts"]]
        assert tree_cons, s["version"]
        triton = [b for b in s["backends"] if b["backend"] == "triton"]
        assert triton and triton[0]["accepts_custom_mask"]
    newest = doc["scans"][-1]
    fast_mla = {b["backend"]: b for b in newest["backends"]}
    oldest = doc["scans"][0]
    assert {b["backend"]: b["mla"] for b in oldest["backends"]}["triton"]  # listed as an MLA backend
    for name in ("flashmla", "trtllm_mla"):
        assert name in fast_mla and fast_mla[name]["mla"] and not fast_mla[name]["accepts_custom_mask"]
