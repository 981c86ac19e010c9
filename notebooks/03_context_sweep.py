# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version,-jupytext.text_representation.format_version
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Context sweep: how far below the memory limit is a decode step?
#
# The deployment's step time grew from 159 ms at 32k to 1430 ms at 185k. Decode attention
# at batch 1 has almost no arithmetic per byte, so the first question is: **how long would
# the step take if it only streamed the latent KV once at full bandwidth?** The gap between
# that floor and the observed time says whether bandwidth is the problem at all.
#
# This notebook does the arithmetic, then reproduces the slope with the baseline kernel
# (a Triton extend-attention kernel shaped like the engine's page_size=1 path) timed on an
# H200, per layer, x 61 layers.

# %% tags=["parameters"]
smoke = False  # small and fast (used by the tests)
measure = "auto"  # "auto": measure on a GPU if there is one, else use data/; "always"; "never"
sweep_file = "context_sweep_h200.json"
peers_file = "peers_h200.json"
heads = 8  # heads per GPU (Kimi-K2 at TP8)
nodes = 9  # tree nodes incl. root (budget 8)

# %%
import pandas as pd

from specdiag import analysis, data, plots


def run_sweep():
    from specdiag.bench import timing

    contexts = (4096, 32768) if smoke else timing.SWEEP_CONTEXTS
    ceilings = timing.measure_ceilings()
    rows = timing.context_sweep(
        contexts=contexts, heads=(heads,), trees=(nodes,), impls=("triton", "native_auto"), rep_ms=20 if smoke else 60
    )
    return {"ceilings": ceilings, "rows": rows}


doc = data.measure_or_load(measure, sweep_file, run_sweep)
ceilings = doc["ceilings"]
df = analysis.with_auto(analysis.add_roofline(data.sweep_frame(doc), ceilings))  # "native_auto": what impl="auto" runs
print(
    f"ceilings measured in the same run: copy {ceilings['copy_tb_s']:.2f} "
    f"TB/s (read+write), bf16 GEMM {ceilings['gemm_tflop_s']:.0f} TFLOP/s"
)

# %% [markdown]
# ## The floor: bytes per step
# Each decode step must read every layer's latent KV for the whole prefix once:
# `context x 576 values x 2 bytes x 61 layers`.

# %%
inc = analysis.INCIDENT
floor = pd.DataFrame(
    [analysis.bandwidth_gap(c, inc["step_ms"][c], ceilings["copy_tb_s"]) for c in sorted(inc["step_ms"])]
)
floor.round(2)

# %% [markdown]
# At 64k the step reads about **4.6 GB**. At the bandwidth measured here that is about 1.1 ms;
# the postmortem quoted ~2.5 ms (a more conservative effective bandwidth) and so a ~130x gap.
# Either way the observed 327 ms is two orders of magnitude above the floor: **the step is not
# bandwidth-bound**. Something else is serialising the work.

# %%
g64 = analysis.bandwidth_gap(65536, inc["step_ms"][65536], ceilings["copy_tb_s"])
print(
    f"64k: {g64['kv_gb']:.2f} GB/step, floor {g64['floor_ms']:.2f} ms at {ceilings['copy_tb_s']:.2f} TB/s, "
    f"observed {g64['observed_ms']:.0f} ms -> {g64['gap']:.0f}x above the floor"
)
print(
    f"with the postmortem's quoted floor ({inc['floor_ms_at_64k_quoted']} "
    f"ms): {inc['step_ms'][65536] / inc['floor_ms_at_64k_quoted']:.0f}x"
)

# %% [markdown]
# ## Reproducing the slope with the baseline kernel
# Per-layer time of the page_size=1 extend kernel, x 61 layers, against the reported step times.
# At batch 1 its grid is `(1, heads, ceil(nodes/16))`: **8 CTAs on a 132-SM GPU**, each walking
# the whole prefix with one gathered token index per key.

# %%
sel = df[(df.heads == heads) & (df.nodes == nodes) & df.ms.notna() & df.impl.isin(["triton", "native_auto"])]
table = sel.pivot_table(index="context", columns="impl", values="step_ms").round(1)
table.columns = [f"{c} step ms (x61)" for c in table.columns]
table

# %%
fig = plots.step_time_vs_context(df, heads, nodes, incident=inc["step_ms"], source=data.provenance(doc))

# %%
base = sel[sel.impl == "triton"].set_index("context")
print("baseline per-layer time / floor:")
print(base[["ms", "floor_ms", "x_floor", "ctas"]].round(3).to_string())

# %% [markdown]
# ## The deployment's own kernel
# The baseline above is this workbook's imitation of the engine's kernel. The real one, SGLang
# 0.5.23's Triton `extend_attention_fwd`, loaded unmodified from its wheel and called with the
# arguments its Triton backend passes in target-verify, was timed beside it and beside the fix in
# one run (`data/peers_h200.json`; notebook 05 section 5 has the rest of that run).


# %%
def run_peers():
    from specdiag.bench import peers, timing

    contexts = (4096, 32768) if smoke else peers.PEER_CONTEXTS
    rows, missing = peers.peer_sweep(
        contexts=contexts, shapes=((heads, nodes),), impls=("native", "sglang", "triton"), rep_ms=20 if smoke else 40
    )
    return {"ceilings": timing.measure_ceilings(), "rows": rows, "missing": missing}


from specdiag.attention.peers import sglang_runs_here

peers_doc = data.measure_or_load(
    measure, peers_file, run_peers, available=sglang_runs_here, needs="a CUDA GPU and the sglang wheel"
)
pdf = analysis.peers_frame(peers_doc)  # "native": what impl="auto" runs now
real = pdf[(pdf.heads == heads) & (pdf.nodes == nodes)].pivot_table(index="context", columns="impl", values="ms")
real["sglang x61 (s)"] = real["sglang"] * analysis.LAYERS / 1e3
real["sglang / our imitation"] = real["sglang"] / real["triton"]
real["sglang / the fix"] = real["sglang"] / real["native"]
print(analysis.speedup_range(pdf[pdf.heads == heads], "sglang", "native", "the real sglang kernel / the fix"))
real[["sglang", "triton", "native", "sglang x61 (s)", "sglang / our imitation", "sglang / the fix"]].round(3)

# %% [markdown]
# **Explore.** Any context, heads and tree size: the bytes a step must read, the floor they set,
# and the baseline and the fix interpolated between the measured contexts (the reported step
# where the postmortem gives one).

# %%
from specdiag import widgets

ctx_explorer = widgets.context_explorer(
    pdf, peers_doc["ceilings"], reported=inc["step_ms"], source=data.provenance(peers_doc)
)
fig = ctx_explorer.static()  # 64k: the default view
ctx_explorer.widget()

# %% [markdown]
# ## Why the H200 baseline is slower than the deployment's whole step
# At 185k the real kernel's 61 layers alone take longer on this H200 than the deployment's whole
# step on its own GPUs (printed below). The two numbers come from different GPUs: the deployment
# ran on RTX PRO 6000 Blackwell cards (sm_120). This kernel's time is set by one CTA's serial
# walk over the prefix (8 CTAs, one per head, on a GPU of 132 SMs), so what matters is how fast
# one SM streams tokens (its clock, its memory latency, the tile shape), not the GPU's bandwidth
# or size; and the engine picks a different tile shape on sm_120 than on Hopper (printed from
# the sglang source below). Neither GPU's time is anywhere near the bandwidth floor.

# %%
c185 = int(real.index.max())
print(
    f"{c185:,} tokens: real kernel x61 on this H200 {real.loc[c185, 'sglang x61 (s)']:.2f} s; "
    f"the deployment's whole step {inc['step_ms'].get(c185, float('nan')) / 1e3:.2f} s"
)
from specdiag.attention import peers as peer_kernels

try:
    for cap in ((9, 0), (12, 0)):
        tile = peer_kernels.sglang_tile(cap)
        print(f"sglang's tile on sm_{cap[0]}{cap[1]}: {tile['block_m']} query rows x {tile['block_n']} keys")
except FileNotFoundError as e:
    print(f"(no sglang source here to read its tile shapes: {e})")

# %% [markdown]
# The baseline's time grows linearly with context at about **0.9 TFLOP/s and ~0.01 TB/s**:
# under 1% of either ceiling. It reproduces the deployment's slope (about 1.9 s of attention
# per step at 185k across 61 layers on this H200). Notebook 04 finds in the engine's source
# why this kernel is the one that runs, and notebook 05 replaces it.
