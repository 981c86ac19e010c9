"""The bottom line's arithmetic (specdiag.postmortem) on made-up numbers with known answers."""

import pytest

from specdiag import postmortem

STEPS = {1000: 100.0, 2000: 200.0, 4000: 600.0}
BASE = {1000: 1.0, 2000: 2.0, 4000: 4.0}  # ms per layer on the H200, linear in context


def test_reading_1_gives_attention_as_much_as_every_step_allows():
    split, k = postmortem.split_steps(BASE, STEPS, layers=50)  # H200 attention 50, 100, 200 ms
    assert k == pytest.approx(2.0)  # min(100/50, 200/100, 600/200)
    assert split.rest_ms.tolist() == pytest.approx([0.0, 0.0, 200.0])
    floor, k_floor = postmortem.split_steps(BASE, STEPS, layers=50, rest_floor_ms=10.0)
    assert k_floor == pytest.approx(1.8) and floor.rest_ms.min() == pytest.approx(10.0)


def test_reading_2_caps_attention_at_each_step():
    split, _ = postmortem.split_steps(BASE, STEPS, layers=50, k=3.0)
    assert split.attention_ms.tolist() == pytest.approx([100.0, 200.0, 600.0])
    assert split.rest_ms.tolist() == pytest.approx([0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="leaves no time for attention"):
        postmortem.split_steps(BASE, STEPS, layers=50, rest_floor_ms=100.0)
    with pytest.raises(ValueError, match="no baseline measurement"):
        postmortem.split_steps({5: 1.0}, STEPS)


def test_fixed_steps_add_the_fix_to_the_rest():
    split, _ = postmortem.split_steps(BASE, STEPS, layers=50)
    fixed = postmortem.fixed_steps(split, {c: 0.02 for c in BASE}, commits=(1, 8), layers=50)
    assert fixed.native_attention_ms.tolist() == pytest.approx([1.0, 1.0, 1.0])  # 0.02 ms x 50
    assert fixed.fixed_step_ms.tolist() == pytest.approx([1.0, 1.0, 201.0])
    assert fixed.tok_s_fixed_commit8.iloc[-1] == pytest.approx(8e3 / 201.0)
    assert fixed.tok_s_now_commit1.iloc[0] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="no time for the fix at contexts"):
        postmortem.fixed_steps(split, {1000: 0.02})


def test_deployment_layer_ms_scales_by_sms_down_to_the_bandwidth_floor():
    # SM-bound: 1 ms on 132 SMs -> 132/264 ms on 264 SMs of the same rate, 2x that at half the rate
    assert postmortem.deployment_layer_ms(1.0, 1e6, 132, 264, 2.0) == pytest.approx(0.5)
    assert postmortem.deployment_layer_ms(1.0, 1e6, 132, 264, 2.0, sm_rate=0.5) == pytest.approx(1.0)
    # never below the bytes over the deployment's bandwidth: 2e9 B / 2 TB/s = 1 ms
    assert postmortem.deployment_layer_ms(1.0, 2e9, 132, 264, 2.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        postmortem.deployment_layer_ms(1.0, 1e6, 132, 0, 2.0)


def test_notebooks_05_and_06_assume_the_same_deployment_gpu():
    from pathlib import Path

    from specdiag.runner import notebook_parameters

    nbs = Path(__file__).resolve().parents[1] / "notebooks"
    p05 = notebook_parameters(next(nbs.glob("05_*.py")))
    p06 = notebook_parameters(next(nbs.glob("06_*.py")))
    keys = ("portable_file", "deployment_copy_tb_s", "deployment_sms", "deployment_sm_rate")
    assert {k: p05[k] for k in keys} == {k: p06[k] for k in keys}


def test_portable_table_reads_the_recorded_sweep():
    """The sm_120 kernel's H200 times beside the Hopper kernel's from data/mma_small_h200.json, and
    each estimate equal to deployment_layer_ms of its row."""
    from specdiag import data
    from specdiag.cost import attention_cost

    doc = data.load_json("mma_small_h200.json")
    t = postmortem.portable_table(doc, 8, 9, 188, 1.79)
    assert list(t.index) == [32768, 65536, 185000] and (t.x_hopper > 1).all()
    for c, r in t.iterrows():
        kv = attention_cost(c, 9, 8)["kv_bytes"]
        assert r.deployment_est == pytest.approx(postmortem.deployment_layer_ms(r.mma_small, kv, 132, 188, 1.79))
