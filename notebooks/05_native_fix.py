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
# # 05 · The native fix: a tree-verify attention kernel that uses the whole GPU
#
# The baseline gives each head one CTA that walks the whole prefix token by token (notebooks 03
# and 04). The fix reads the paged prefix as whole 1152-byte token rows, **splits it across all
# SMs**, runs the tree block under the ancestor mask, and **merges the partials by log-sum-exp**.
# All `nodes x heads` query rows of a request share one pass over the keys on the tensor cores.
#
# Four kernel sources, one contract, loaded through pycuda inside PyTorch's context
# (`specdiag.attention.registry` lists them; `impl="auto"` picks one by GPU and shape):
# `kernels/tree_verify_seesaw.cu` is the Hopper kernel, `kernels/tree_verify_wide.cu` the Hopper
# kernel for requests of 65-72 query rows at long prefixes (the deployment's 8 heads x 9 nodes: one
# CTA reads each key once), `kernels/tree_verify_mma.cu` the portable one (sm_80 and up, in three
# tile sizes so that it fits each GPU's shared memory), `kernels/tree_verify_wgmma.cu` a Hopper
# kernel with a lower fixed cost for short prefixes; `kernels/tree_verify_merge.cu` merges. How
# each version got here: `docs/kernel_notes.md`.

# %% tags=["parameters"]
smoke = False
measure = "auto"  # "auto" | "always" | "never"
sweep_file = "context_sweep_h200.json"
check_files = {
    "mma": "native_check_h200.json",
    "wgmma": "native_check_wgmma_h200.json",
    "wgmma_seesaw": "native_check_wgmma_seesaw_h200.json",
    "wgmma_wide": "native_check_wgmma_wide_h200.json",
    "mma_small": "native_check_mma_small_h200.json",
}
ablation_file = "native_ablation_h200.json"
trace_file = "trace_seesaw_stages_h200.json"
peers_file = "peers_h200.json"
portable_file = "mma_small_h200.json"  # the kernel auto runs on sm_120, timed on the H200
deployment_copy_tb_s = 1.79  # assumed: the deployment GPU's memory bandwidth (RTX PRO 6000 Blackwell spec sheet)
deployment_sms = 188  # assumed: its SM count (RTX PRO 6000 Blackwell spec sheet)
deployment_sm_rate = 1.0  # assumed: its SM's mma.sync throughput over an H200 SM's (1: the same)
headline_context = 185000
heads = 8  # the deployment's heads per GPU
nodes = 9  # and tree nodes

# %%
import pandas as pd
import torch

from specdiag import analysis, cost, data, machine, plots
from specdiag.attention import (
    make_verify_inputs,
    relative_error,
    tree_verify_attention_ref,
    tree_verify_attention_split,
)
from specdiag.attention.registry import KERNELS


def run_sweep():
    from specdiag.bench import timing

    contexts = (4096, 65536) if smoke else timing.SWEEP_CONTEXTS
    impls = ("native_auto", "native_auto_ps1", "native", "triton", "torch")
    return {
        "ceilings": timing.measure_ceilings(),
        "rows": timing.context_sweep(contexts=contexts, impls=impls, rep_ms=20 if smoke else 60),
    }


doc = data.measure_or_load(measure, sweep_file, run_sweep)
ceilings = doc["ceilings"]
df = analysis.with_auto(analysis.add_roofline(data.sweep_frame(doc), ceilings))
ctx = headline_context if headline_context in set(df.context) else int(df.context.max())

# %% [markdown]
# ## The answer
# The deployment's shape (8 heads, a 9-node tree) at the longest context measured: the
# baseline, what `impl="auto"` runs, and the floor set by the bytes and FLOPs it must move.

# %%
at = df[(df.context == ctx) & (df.heads == heads) & (df.nodes == nodes)].set_index("impl")
base, fix = at.loc["triton"], at.loc["native_auto"]
print(f"{ctx:,} tokens, {heads} heads x {nodes} nodes, per layer / per {cost.LAYERS}-layer step:")
print(f"  baseline (Triton, page_size=1): {base.ms * 1e3:9.1f} us  {base.step_ms:8.1f} ms")
print(
    f"  native, auto -> {fix.get('kernel', '?'):>12}: {fix.ms * 1e3:9.1f} "
    f"us  {fix.step_ms:8.1f} ms   {base.ms / fix.ms:.0f}x faster"
)
print(
    f"  floor max(bytes/BW, FLOPs/GEMM):     {fix.floor_ms * 1e3:9.1f} "
    f"us  ({fix.x_floor:.2f}x from it, {fix.bound}-bound)"
)

# %% [markdown]
# ## 1. The design
# * **prefix**: a CTA takes 64 query rows and one split of the prefix, read page by page as whole
#   1152-byte token rows with 16-byte `cp.async` (any page size, page_size=1 included), **no mask**;
# * **tree block**: the nodes' own latents under the ancestor mask, in splits of their own;
# * **merge**: each split writes its normalised output and LSE; a second kernel combines them.
#
# On Hopper the seesaw kernel runs three warpgroups per CTA: one issues every tile load, two take
# the 64-key tiles in pairs, each computing one tile's scores while the other computes the
# other's, then both adding P V of both tiles to their halves of the output (FlashMLA's order).
# The recordings below measured an earlier form that took the tiles in turn (`TV_PAIR=0`;
# `docs/kernel_notes.md` has both). The wide kernel takes all 72 query rows of an 8-head, 9-node
# request in one CTA (keys in the wgmma's M, query rows in its N), where the 64-row kernels need
# two CTAs that each read every key. Each kernel's launch shape, from the registry:

# %%
pd.DataFrame(
    [
        dict(
            impl=k.name,
            source=f"kernels/{k.source}.cu",
            threads=k.threads,
            rows_per_cta=k.rows_per_cta,
            keys_per_tile=k.keys_per_tile,
            target=k.arch,
            what=k.title,
        )
        for k in KERNELS.values()
    ]
)

# %% [markdown]
# ## 2. Splitting is exact
# Attention over `[prefix ; tree]` equals the LSE-merge of attention over the prefix (no mask)
# and over the tree (ancestor mask). Checked here in float64 on random ragged, shuffled-page inputs.

# %%
x, trees = make_verify_inputs(
    [40, 0, 333] if not smoke else [17, 0], nodes=9, heads=4, page_size=16, seed=7, dtype=torch.float64
)
o_full, l_full = tree_verify_attention_ref(**x, scale=cost.SOFTMAX_SCALE)
o_split, l_split = tree_verify_attention_split(**x, scale=cost.SOFTMAX_SCALE)
print(
    f"split vs one softmax: rel err out {relative_error(o_split, o_full):.1e}, "
    f"lse {relative_error(l_split, l_full):.1e}"
)
assert relative_error(o_split, o_full) < 1e-12

# %% [markdown]
# ## 3. Each kernel against a float64 reference
# Fresh random inputs per case, outputs poisoned with NaN before the launch, every pool slot no
# request uses set to NaN too, ragged batches, shuffled pages, chain / fan / random trees, page
# sizes 1 to 128, 1 to 1024 nodes, 1 to 128 heads.

# %%
from specdiag.bench import checks

hopper = machine.sm90_available()
checked = {}
for impl, f in check_files.items():
    available, needs = (
        (lambda: hopper, "an sm_90 GPU") if KERNELS[impl].hopper_only else (data.gpu_available, "a CUDA GPU")
    )
    checked[impl] = data.measure_or_load(
        measure, f, lambda impl=impl: {"results": checks.check_native(impl=impl)}, available=available, needs=needs
    )
results = pd.DataFrame([dict(r, kernel=k) for k, c in checked.items() for r in c["results"]])
results["ok"] = [checks.passed(r) for r in results.to_dict("records")]
for k, g in results.groupby("kernel", sort=False):
    print(
        f"{k}: {int(g.ok.sum())} of {len(g)} cases pass (bf16 output: rel err < {checks.OUT_TOLERANCE}; "
        f"lse < {checks.LSE_TOLERANCE}), worst rel err out {g.rel_err_out.max():.1e}"
    )
results[["kernel", "prefix_lens", "nodes", "heads", "page_size", "tree", "splits", "rel_err_out", "rel_err_lse", "ok"]]

# %% [markdown]
# ## 4. Speed against the page_size=1 baseline
# `native_auto` is what `impl="auto"` runs at each shape; `native` is the portable mma.sync kernel.

# %%
speed = analysis.speedup_table(df, new="native_auto")
print(analysis.speedup_range(df, "triton", "native_auto", "baseline / auto"))
print(analysis.speedup_range(df, "native", "native_auto", "portable mma.sync / auto"))
if "native_auto_ps1" in set(df.impl):
    print(analysis.speedup_range(df, "native_auto_ps1", "native_auto", "auto at page_size=1 / page_size=64"))
speed[speed.context == ctx].round(3)

# %% [markdown]
# The naive torch path (gather the prefix, two matmuls, softmax) beats the engine-shaped baseline
# at long context, clumsy as it is, because its matmuls use the whole GPU: the baseline's problem
# is its shape (a handful of CTAs walking the prefix), not the arithmetic.

# %%
fig = plots.speedup_bars(speed, ctx, source=data.provenance(doc))

# %%
fig = plots.step_time_vs_context(df, heads, nodes, incident=analysis.INCIDENT["step_ms"], source=data.provenance(doc))

# %% [markdown]
# ## 5. Beside the real peers
# One run on one GPU (the first line of the output below names it), the same rotated inputs for all
# (`python -m specdiag.bench peers`):
# * `sglang`: the deployment's own kernel, SGLang 0.5.23's Triton `extend_attention_fwd` loaded
#   unmodified from its wheel and called as its Triton backend calls it in target-verify;
# * `triton`: this workbook's imitation of it (notebook 03's baseline);
# * `flashmla`: DeepSeek's FlashMLA SM90 dense decode over the prefix alone (no tree mask, page
#   size 64): the same split-KV design, the best peer for the part of the work they share;
#   `flashmla_cascade` adds the tree block and the merge in torch, a verify one could build on it
#   (a dozen small torch calls: where FlashMLA itself is fast, their launch costs dominate);
# * `flashmla_sparse`: FlashMLA's SM90 sparse prefill, which gathers single tokens: the whole
#   verify at page size 1 through it, for 64 or 128 heads (shown where the recording has it);
# * `native`: ours, what `impl="auto"` runs now, page size 1 as DDTree forces it (where `auto` has
#   since changed its pick, that kernel's own rows of the same run, `native:KERNEL`:
#   `analysis.peers_frame`); `native_ps64`: `auto` at page size 64 as it ran when recorded.
#
# A peer that took longer at a context than at the next longer one read more keys in less time
# there, so its shorter-context time is suspect: the cell names such shapes (the H200's FlashMLA
# at 32k and 9 nodes, `docs/kernel_notes.md`, thirty-fifth session). The kernel's targets beside
# them, and where the recording stands:


# %%
def run_peers():
    from specdiag.bench import peers, timing

    shapes = ((heads, nodes),) if smoke else peers.PEER_SHAPES
    contexts = (4096, 65536) if smoke else peers.PEER_CONTEXTS
    rows, missing = peers.peer_sweep(contexts=contexts, shapes=shapes, rep_ms=20 if smoke else 40)
    return {"ceilings": timing.measure_ceilings(), "rows": rows, "missing": missing}


peers_doc = data.measure_or_load(measure, peers_file, run_peers)
pdf = analysis.peers_frame(peers_doc)  # "native": what impl="auto" runs now
ptab = analysis.peer_table(pdf)
pctx = ctx if ctx in set(ptab.context) else int(ptab.context.max())
dep = ptab[(ptab.context == pctx) & (ptab.heads == heads) & (ptab.nodes == nodes)].iloc[0]
print(f"{pctx:,} tokens, {heads} heads x {nodes} nodes, one layer:")
for impl in ("sglang", "triton", "flashmla", "flashmla_cascade", "flashmla_sparse", "native", "native_ps64", "floor"):
    if impl in dep and dep[impl] == dep[impl]:
        print(f"  {impl:>17}: {dep[impl] * 1e3:9.1f} us  = {dep[impl] / dep.native:7.2f}x ours")
print(analysis.speedup_range(pdf, "sglang", "native", "the real sglang kernel / ours"))
print(analysis.speedup_range(pdf, "flashmla", "native", "FlashMLA's prefix call alone / ours"))
if "flashmla_sparse" in set(pdf.impl):
    print(analysis.speedup_range(pdf, "flashmla_sparse", "native", "FlashMLA's sparse prefill, page size 1 / ours"))
for peer in ("sglang", "flashmla", "flashmla_sparse"):
    if odd := analysis.slower_than_longer(ptab, peer):  # the ranges above include these shapes
        shapes = ", ".join(f"{c:,} x {h} x {n}" for c, h, n in odd)
        print(f"  suspect: {peer} took longer than at the next longer context at {shapes}")
for t in analysis.peer_targets(ptab):
    print(f"target {'met' if t['met'] else 'NOT met'}: {t['target']}: {t['measured']}")

# %% [markdown]
# Every peers recording in `data/` on the same targets: each is one run on one GPU, with the
# kernels and plan of its day (`sources`: `machine.native_digest`;
# `python tools/compare_revision/digest.py data/RECORDING` lists the commits that give it).

# %%
recordings = {p.name: data.load_json(p.name) for p in sorted(data.data_dir().glob("peers_*.json"))}
for _, rec in analysis.targets_by_recording(recordings).iterrows():
    print(f"{rec.recording} ({rec.gpu}, {rec.recorded}, sources {rec.sources}):")
    for target, standing in rec.iloc[4:].items():
        print(f"  {target}: {standing}")

# %%
fig = plots.peers_vs_context(pdf, heads, nodes, source=data.provenance(peers_doc))

# %% [markdown]
# **Explore.** Any measured shape: ours, the baseline, the peers and the floor.

# %%
from specdiag import widgets

shapes = widgets.shape_explorer(ptab, source=data.provenance(peers_doc))
fig = shapes.static()  # the deployment's shape: the default view
shapes.widget()

# %% [markdown]
# The fix is two orders of magnitude faster than the kernel the deployment ran, but it is not
# yet at FlashMLA's level everywhere. At the deployment's shape FlashMLA reads the KV twice (72
# query rows span two of its 64-row CTAs); `auto` runs the wide kernel there, which takes all 72
# in one CTA and reads it once, and our whole verify is faster than FlashMLA's prefix call alone
# at the 72-row shapes from 32k (the first target above counts them). It is still well above the
# floor: the wide kernel's loop is paced by the bytes a CTA keeps in flight, not by its math
# (`docs/kernel_notes.md`). At 144 rows and more FlashMLA's prefix call is faster; at >= 2000 rows
# it comes closer to the floor than we do, and our page-size-64 build (`native_ps64`) is no faster
# than page size 1 there: that gap is in the kernel's pipeline, not in the page-size-1 gather.

# %% [markdown]
# **Is the gap per key, or paid once per call?** A line through each shape's times from 32k splits
# them into a cost per 1,024 keys (the loop) and a cost at zero keys (what a call does once: its
# launches, first and last tiles, the tree block, the merge). Suspect peer times are left out; a
# negative fixed cost says the time grows faster than the context (the clock falls on long
# compute-bound calls):

# %%
fits = analysis.context_fits(ptab).pivot_table(
    index=["heads", "nodes"], columns="impl", values=["us_per_1k_keys", "fixed_us"]
)
print(fits.round(1).to_string())

# %% [markdown]
# **Can a page-size-1 kernel meet the first target at >= 2,000 query rows?** The best one measured
# here, FlashMLA's sparse prefill (the whole verify from single-token gathers, a `cp.async` loader
# like ours), beside ours and FlashMLA's dense decode in one run at 128 heads x 65 nodes (recorded,
# not re-measured here; `docs/kernel_notes.md`, thirty-second session):

# %%
ps1_doc = data.load_json("history/session32_h100.json")["run4_peers_sparse"]
ps1 = analysis.peer_table(analysis.add_roofline(data.sweep_frame(ps1_doc), ps1_doc["ceilings"]))
ps1["flashmla_sparse / flashmla"] = ps1["flashmla_sparse"] / ps1["flashmla"]
print(data.provenance(ps1_doc))
cols = ["context", "heads", "nodes", "native / flashmla", "flashmla_sparse / flashmla", "native / flashmla_sparse"]
print(ps1[cols].round(2).to_string(index=False))
for col in cols[3:]:
    print(f"{col}: {ps1[col].min():.2f}x to {ps1[col].max():.2f}x")

# %% [markdown]
# The page-size-1 peer misses "<= 1.00x FlashMLA's prefix call" at these shapes too, by less than
# we do. Ours trails that peer as well: with the same number of `cp.async` it keeps the tensor
# pipe busier (the notes' Nsight Compute table), which is what a better schedule could still take.

# %% [markdown]
# ## 6. On the deployment's GPUs
# The deployment ran on RTX PRO 6000 Blackwell GPUs (sm_120: no wgmma, 99 KB of shared memory per
# CTA). `auto` there runs the portable mma.sync kernel in the variant that fits:

# %%
from specdiag.attention.registry import SMEM_PER_BLOCK, auto_kernel

sm120 = KERNELS[auto_kernel((12, 0), heads * nodes, pctx)]
print(
    f"sm_120: {sm120.name} ({sm120.title}); {sm120.smem_bytes:,} bytes of shared memory per CTA "
    f"of {SMEM_PER_BLOCK[(12, 0)]:,}"
)
ok = results[results.kernel == sm120.name]
print(f"on the H200 it passes {int(ok.ok.sum())} of {len(ok)} float64 checks" if len(ok) else "not checked here")

# %% [markdown]
# Its speed on the H200, beside the Hopper kernel in the same run (page size 1), and what that
# suggests for the deployment's GPUs: an estimate (`specdiag.postmortem.deployment_layer_ms`). On
# the H200 this kernel reads far below the copy bandwidth, so its time follows the SMs: their count
# and an assumed per-SM rate, never below the deployment's bandwidth floor. Notebook 06 puts it
# into the deployment's steps.

# %%
from specdiag import postmortem


def run_portable():
    from specdiag.bench import timing

    return timing.portable_sweep((32768, 65536, headline_context), heads, nodes)


portable_doc = data.measure_or_load(
    "never" if smoke else measure, portable_file, run_portable, available=lambda: hopper, needs="an sm_90 GPU"
)
prt = postmortem.portable_table(portable_doc, heads, nodes, deployment_sms, deployment_copy_tb_s, deployment_sm_rate)
print(
    f"{data.provenance(portable_doc)}; ms per layer; deployment_est: {deployment_sms} SMs at "
    f"{deployment_sm_rate:g}x an H200 SM's rate, {deployment_copy_tb_s} TB/s (assumed)"
)
prt.round(3)

# %% [markdown]
# ## 7. How close to the hardware?
# `floor = max(bytes / copy bandwidth, FLOPs / bf16 GEMM rate)`, both ceilings measured in the
# same run. The FLOPs count every query row against every key (576 + 512 per pair).

# %%
print(f"ceilings of this run: copy {ceilings['copy_tb_s']:.2f} TB/s, bf16 GEMM {ceilings['gemm_tflop_s']:.0f} TFLOP/s")
auto = df[(df.impl == "native_auto") & (df.context >= 32768)]
print(
    f"auto at >= 32k: {auto.x_floor.min():.2f}x to {auto.x_floor.max():.2f}x "
    f"the floor, up to {auto.tflop_s.max():.0f} TFLOP/s"
)
auto[["context", "heads", "nodes", "kernel", "ms", "floor_ms", "x_floor", "bound", "tflop_s", "tb_s"]].round(3)

# %%
fig = plots.gap_vs_context(df, heads, nodes, source=data.provenance(doc))

# %% [markdown]
# ## 8. What a decode step gains
# Attention only (61 layers); the rest of the step (MLP, MoE, sampling) is unchanged.

# %%
step = (
    df[(df.context == ctx) & df.impl.isin(["triton", "native_auto"])]
    .pivot_table(index=["heads", "nodes"], columns="impl", values="step_ms")
    .round(1)
)
step["saved ms/step"] = (step["triton"] - step["native_auto"]).round(1)
step

# %% [markdown]
# ## 9. What bounds it now: one stage left out at a time
# The seesaw kernel rebuilt with one stage switched off (`TV_SKIP`, results wrong by design, the
# same launches), each timed as a fraction of the full kernel. A stage whose removal barely
# changes the time is hidden under the others; the loads alone and the math alone each take
# most of a tile's time, so neither alone is the bound.


# %%
def run_ablation():
    from specdiag.bench.ablation import ablate

    return {"rows": ablate(shapes=((65536, 8, 65),) if smoke else ((65536, 64, 257), (185000, 8, 65), (185000, 8, 9)))}


abl = data.measure_or_load(measure, ablation_file, run_ablation, available=lambda: hopper, needs="an sm_90 GPU")
pd.DataFrame(abl["rows"]).pivot_table(
    index=["impl", "context", "heads", "nodes"], columns="variant", values="vs_full", sort=False
).round(2)

# %% [markdown]
# **Tile by tile.** A build of the seesaw kernel (its turn-taking schedule, `TV_PAIR=0`) that
# timestamps each tile's steps in one CTA (`TV_TRACE`, `python -m specdiag.bench trace`) shows
# where a tile's cycles go: how long each math warpgroup waits for its tile to land, how long the
# loader takes to issue a tile's copies, and the period between tiles. Here with one math stage left out at a time (`TV_SKIP` 1: Q K^T,
# 2: P V, 4: the softmax, 3: both products).


# %%
def run_trace():
    from specdiag.bench.trace import TRACE_SHAPES, trace_seesaw

    shapes = TRACE_SHAPES[-1:] if smoke else TRACE_SHAPES
    builds = ({}, {"TV_SKIP": 1}, {"TV_SKIP": 2}, {"TV_SKIP": 4}, {"TV_SKIP": 3})
    return {"runs": [trace_seesaw(c, h, t, page_size=1, defines=d) for c, h, t in shapes for d in builds]}


trc = data.measure_or_load(measure, trace_file, run_trace, available=lambda: hopper, needs="an sm_90 GPU")
tt = analysis.trace_table(trc)
stage = {"TV_SKIP=1": "Q K^T", "TV_SKIP=2": "P V", "TV_SKIP=4": "the softmax"}
for (c, h, t, ps), g in tt.groupby(level=[0, 1, 2, 3]):
    g = g.droplevel([0, 1, 2, 3])
    one = g.period[[b for b in stage if b in g.index]]
    turn = 2 * g.period["default"]  # each math warpgroup takes every other tile
    waits = g.wait_other_p["default"] + g.wait_part0["default"]
    print(
        f"{c:,} tokens x {h} heads x {t} nodes: {g.period['default']:.0f} cycles a tile. Each math warpgroup "
        f"waits {waits:.0f} of its {turn:.0f}-cycle turn for the other's P and its tile's first part; the "
        f"loader waits {g.loader_wait_stage['default']:.0f} for a free stage, then takes "
        f"{g.load_issue['default']:.0f} to issue a tile's copies. Without {stage[one.idxmin()]} the period "
        f"is {one.min():.0f}."
    )
# the whole-kernel phases (first tile, steady loop, epilogue) where the recording has them
tt[
    ["period", "wait_other_p", "wait_part0", "loader_wait_stage", "load_issue", "load_to_all", "softmax"]
    + [c for c in ("prologue", "loop", "epilogue") if c in tt]
]

# %% [markdown]
# The timeline alone does not say which of the two a math warpgroup waits for: its clock read
# right after the hand-off barrier may come back before the barrier does (below). Nsight
# Compute's warp-stall sampling of the kernel without any timestamps tells them apart, per
# SASS instruction, summed here per warp role (`python -m specdiag.bench stalls`; recorded, not
# re-measured here):

# %%
stall_doc = data.load_json("ncu_stalls_seesaw_h200.json")
print(analysis.stall_table(stall_doc).to_string())
for r in stall_doc["runs"]:
    for role, v in r["roles"].items():
        for site in v["top"]:
            share = 100 * site["samples"] / v["samples"]
            if share >= 5:
                print(f"{r['shape']} {role}: {share:.0f}% of its samples at [{site['index']}], after `{site['after']}`")

# %% [markdown]
# Both roles mostly wait at a barrier. The loader waits for a free stage (the named barrier in
# `R10`: 1 or 2); the math warpgroups wait for each other's P (barrier 3, and barrier 4 a few
# instructions before the second site). Waiting for a tile's data (the `long_sb` stalls at the
# mbarrier's wait loop) is a small share. So the period is set by the schedule, not by the
# copies: a warpgroup's Q K^T (t) is issued only once the other's P (t - 1) has arrived, and with
# two stages a tile's load can start only when the tile two before it has left its stage. The
# loader events of this trace come from a build whose clock read waits for the stage barrier (a
# branch between them). In the builds before it (`data/trace_seesaw_h200.json` and the variants'
# traces) the read came straight after the barrier and the wait showed as a few dozen cycles,
# the rest counted as issuing: only the two together compare across builds.
#
# **Does a longer ring, or Q K^T first, shorten the period?** Two builds test the two halves:
# 32-key tiles in four stages (`TV_BN=32`, the loader three tiles ahead), and the same with each
# warpgroup issuing Q K^T (t) before it waits for the other's P (t - 1) (`TV_QK_FIRST=1`); and,
# at 64 keys, Q K^T first with the other's P V moved after the softmax so that S and O are never
# in flight together (`TV_PV_LATE=1`, timed as a `TV_TRACE` build beside one of the default).
# Timed beside the default build and traced (recorded, not re-measured here; `period` is per
# tile, so per 32 keys in the 32-key builds):

# %%
for name in ("bn32", "pv_late"):
    for line in analysis.variant_summary(data.load_json(f"history/seesaw_{name}_variants_h200.json")):
        print(f"[{name}] {line}")
t32 = analysis.trace_table(data.load_json("history/trace_seesaw_bn32_h200.json"))
print(t32[["period", "qk_tail", "softmax", "loader_wait_stage", "load_to_all"]].to_string())

# %% [markdown]
# Both are correct and slower. With four stages the loader waits longer for a free stage than
# before: the ring was not what held the period. A 32-key tile's softmax step is not half a
# 64-key one: most of it (row reductions across the quad, the factors and P into shared memory,
# the fence and the hand-off) does not scale with the keys. Q K^T first shortens the period a
# little, but its Q K^T then runs beside the other's P V and takes longer. Moving the other's P V
# after the softmax delays the release of its stage, and with two stages the loads starve. With
# the stage traces
# above (a math stage left out barely moves the period at the deployment's shape), this says that
# at 64 keys the math's chain and the tile stream each come close to the period on their own: a
# faster kernel has to shorten both at once. `docs/kernel_notes.md` (sixteenth session) says what
# that leaves to try.
#
# **Would asking L2 for the rows ahead help?** Two builds had the loader prefetch the tile after
# next into L2 (one bulk prefetch per row, or 128-byte lines per thread). Both were measured beside
# the default build and FlashMLA in one run (recorded, not re-measured here):

# %%
for line in analysis.variant_summary(data.load_json("history/seesaw_prefetch_variants_h200.json")):
    print(line)

# %% [markdown]
# Both are slower at every shape, including 32k, whose prefix already sits in L2: what the loader
# adds before a tile's copies costs the whole kernel. The fourteenth session's notes say why, and
# what FlashMLA's token-gathering decode kernel does instead.
#
# **Can a page-size-1 gather keep up, and which of FlashMLA's mechanisms would close our gap?**
# FlashMLA's sparse prefill has our kernel's layout (two math warpgroups, a `cp.async` loader,
# single-token gathers). Beside it and FlashMLA's dense decode in one run, then each of its
# mechanisms built into ours and timed beside the default build (recorded, not re-measured here):

# %%
sparse_doc = data.load_json("history/peers_sparse_h200.json")
sdf = analysis.add_roofline(data.sweep_frame(sparse_doc), sparse_doc["ceilings"])
stab = analysis.peer_table(sdf)
stab["flashmla_sparse / flashmla"] = stab["flashmla_sparse"] / stab["flashmla"]
print(
    stab[["context", "heads", "nodes", "native / flashmla", "flashmla_sparse / flashmla"]]
    .round(2)
    .to_string(index=False)
)
mech = {
    name: data.load_json(f"history/seesaw_{name}_variants_h200.json")
    for name in ("l2_prefetch", "pair", "loader", "stsm", "share_v1")
}
for name, doc in mech.items():
    for line in analysis.variant_summary(doc):
        print(f"[{name}] {line}")
spread = analysis.default_spread(mech)
for ps, g in spread.groupby(level="page_size"):
    print(f"the default build itself, run to run, page size {ps}: up to {g['max / min'].max():.3f}x")

# %% [markdown]
# The sparse prefill is slower than ours at 64 heads, where it has only one CTA per node (65
# CTAs). At 128 heads it runs the same grid as ours and comes closer to the dense decode than ours
# does. Yet none of its mechanisms, moved into our kernel one at a time (its L2
# prefetch size, its pair schedule, one instruction per copy, `stmatrix` for P), is faster than
# the default build at the median of its shapes. The single shapes move both ways by about as much
# as the default build moves from run to run. The last line (`share_v1`) is a first build of
# two CTAs that read the same keys copying half of each tile each and handing it to the other.
#
# **Does sharing each tile between two CTAs, or carrying part of it in registers, help?** The
# sharing build with its hand-off fixed (`TV_SHARE=1`), one that stores each half from registers
# into both CTAs (`TV_SHARE=2`, after FlashMLA's sparse decode), and one without clusters that
# fetches part of each tile into registers a tile ahead (`TV_HYBRID`), each timed beside the
# default build and traced (recorded, not re-measured here):

# %%
for name in ("share_v2_v3", "share_order", "hybrid"):
    for line in analysis.variant_summary(data.load_json(f"history/seesaw_{name}_variants_h200.json")):
        print(f"[{name}] {line}")
for name in ("share_v2_v3", "hybrid"):
    t = analysis.trace_table(data.load_json(f"history/trace_seesaw_{name}_h200.json"))
    print(t[["wait_part0", "period", "loader_wait_stage", "load_issue"]].to_string())

# %% [markdown]
# All are correct and all are slower. Halving a CTA's copies moves their cost into the hand-off
# (a tile is whole only once both halves are in both CTAs, and a stage must be free in both);
# carrying rows in registers moves it into the stores, and the math warpgroups slow down (those
# builds also spill a few registers). Every
# route into shared memory tried so far goes through the SM's load/store path that the math uses
# too. So the lever is fewer instructions on that path for the same bytes, not fewer bytes from
# L2: the sixteenth session's notes in `docs/kernel_notes.md` list what is left to try.

# %% [markdown]
# **With registers for it, does issuing Q K^T ahead of the hand-off pay?** At 216 registers per
# math thread (the loader keeps 72) each warpgroup can issue Q K^T (t) before it waits for the
# other's P (t - 1), with S and O in flight together. Three orders of the other's P V (t - 1)
# after it: waited for after the softmax of t (`TV_QK_AHEAD=1`), before it (`2`), and with the
# stage freed in two halves, each by its last reader, so that Q K^T (t) starts on the half the
# other warpgroup frees first (`TV_SPLIT_RELEASE=1`, alone and with `TV_QK_AHEAD=2` or `3`); only
# one or two of Q K^T's three parts ahead (`TV_QK_EARLY`); and, in the default order, the other's
# stage released earlier instead (`TV_RELEASE_FIRST`, `TV_RELEASE_PART`). Each timed beside the
# default build and FlashMLA, and traced (recorded, not re-measured here):

# %%
ahead_runs = ("qk_ahead", "qk_ahead2", "split", "split_qk3", "qk_early", "release_first", "release_part")
for name in ahead_runs:
    for line in analysis.variant_summary(data.load_json(f"history/seesaw_{name}_variants_h200.json")):
        print(f"[{name}] {line}")
for name in ahead_runs:
    t = analysis.trace_table(data.load_json(f"history/trace_seesaw_{name}_h200.json")).droplevel([2, 3])
    for (c, h), g in t.groupby(level=[0, 1]):
        g = g.droplevel([0, 1])
        for b in (b for b in g.index if b != "default"):
            print(
                f"[{name}] {c:,} x {h} heads, {b}: {g.period[b]:.0f} cycles a tile (default "
                f"{g.period['default']:.0f}); the loader waits {g.loader_wait_stage[b]:.0f} for a stage "
                f"(default {g.loader_wait_stage['default']:.0f}); the math has a tile's last part "
                f"{g.load_to_all[b]:.0f} after its stage frees (default {g.load_to_all['default']:.0f}); "
                f"the softmax step {g.softmax[b]:.0f} (default {g.softmax['default']:.0f})"
            )
spread = analysis.default_spread({n: data.load_json(f"history/seesaw_{n}_variants_h200.json") for n in ahead_runs})
print(f"the default build across these runs: up to {spread['max / min'].max():.3f}x from run to run")

# %% [markdown]
# All are correct and none is faster at the median. In the Q K^T-ahead builds the loader waits
# far longer for a stage. A warpgroup's wgmma groups complete in the order they were issued:
# once Q K^T (t) goes before the other's P V (t - 1), the wait that frees the other's stage also
# waits for Q K^T (t), whose tile must land first. The stage's release then depends on the next tile's load, and the
# loop from a release through the next load, Q K^T and the softmax back to a release spans one
# tile instead of two. Freeing the stage in halves alone moves the loader's wait to the first
# half (its trace counts that wait only) and lengthens the softmax step. Releasing the stage
# earlier in the default order does not help either: the tiles then land well before the math
# needs them, the loader's wait is only the slack the period leaves it, and the period follows
# the math's chain (the other's P, P V and Q K^T, the softmax, the hand-off). With two 72 KB
# stages next to a 72 KB Q there is no room for a third, so the default order keeps the shorter
# of the two loops. `docs/kernel_notes.md` (seventeenth session) works through the loops with the
# traced intervals.

# %% [markdown]
# **What did shorten the chain?** The softmax step's exponent: `exp2f` compiles to four
# instructions per score (it keeps results under 2^-126 as denormals), `ex2.approx.ftz` to one
# (`TV_FAST_EXP=1`); adding the row sums after P is handed on (`TV_SUM_LATE=1`) was tried beside
# it. Two runs, each beside the build before it (recorded, not re-measured here):

# %%
for name in ("softmax", "fast_exp"):
    for line in analysis.variant_summary(data.load_json(f"history/seesaw_{name}_variants_h200.json")):
        print(f"[{name}] {line}")
    t = analysis.trace_table(data.load_json(f"history/trace_seesaw_{name}_h200.json")).droplevel([2, 3])
    for (c, h), g in t.groupby(level=[0, 1]):
        g = g.droplevel([0, 1])
        print(
            f"[{name}] {c:,} x {h} heads: softmax step {g.softmax['TV_FAST_EXP=1']:.0f} cycles "
            f"(before: {g.softmax['default']:.0f}), period {g.period['TV_FAST_EXP=1']:.0f} "
            f"(before: {g.period['default']:.0f})"
        )

# %% [markdown]
# One instruction per exponent is faster at the median of both page sizes in both runs and
# bit-identical on the identity cases, so the seesaw kernel now takes it (`tvc::score_exp2<true>`);
# section 5's peers and the traces above were recorded with it. The row sums moved later, or the
# release moved earlier beside it, take the gain back.

# %% [markdown]
# **When do the default schedule's copies land?** The seesaw kernel's default schedule
# (`TV_PAIR=1`, FlashMLA's order) takes tiles in pairs: math warpgroup 0 takes tile a in stage 0,
# warpgroup 1 tile b in stage 1. Each stage lands and is freed in two groups of column blocks: an
# early group read only by its owner, and a late group that the other warpgroup's P V also reads.
# Its trace records three times for each group: when it is freed, when the loader has issued its
# copies, and when its owner's wait for it returns. An H100, recorded, not re-measured here:

# %%
s41 = data.load_json("history/session41_h100.json")
(pair_trace,) = [r for r in s41["run2_trace_base"]["runs"] if r["defines"].get("TV_PAIR") == 1]
copies, idle, pair_cycles = analysis.pair_copies(pair_trace)
print(
    f"{s41['machine']['gpu']} ({s41['machine']['recorded_utc'][:10]}), {pair_trace['context']:,} tokens x "
    f"{pair_trace['heads']} heads x "
    f"{pair_trace['nodes']} nodes: a pair of tiles every {pair_cycles:,} cycles (medians, cycles after "
    "warpgroup 0's loop top)"
)
print(copies.to_string())
print(
    f"A group lands {copies.issued_to_landed.min():,} to {copies.issued_to_landed.max():,} cycles after its "
    f"copies are issued. For {idle:,} cycles of each pair no copy is in flight."
)

# %% [markdown]
# A group is freed only by the last P V that reads it, so for part of each pair both stages hold
# tiles still being read and nothing loads. The two FlashMLA devices tried against the late
# copies were both slower: an mbarrier for each column block, and Q's rope block in registers so
# that stage 0's rope block could join its early group (`docs/kernel_notes.md`, forty-first
# session).

# %% [markdown]
# **Do the copies or the math pace a pair?** The same trace of two ablation builds answers it: one
# with the copies alone (`TV_SKIP=7`: no Q K^T, softmax or P V) and one with the math alone
# (`TV_SKIP=8`: no copies). An H100, recorded, not re-measured here:

# %%
s42 = data.load_json("history/session42_h100.json")
for side, what in (("base", "default"), ("skip7", "copies alone"), ("skip8", "math alone")):
    periods = ", ".join(
        f"{r['context']:,} x {r['heads']} x {r['nodes']}: {r['median_cycles']['period']:,.0f}"
        for r in s42[f"run1_trace_{side}"]["runs"]
    )
    print(f"{what:>13}: cycles a tile, {periods}")

# %% [markdown]
# With no copies at all the math takes as long as the whole kernel: the math paces a pair, and
# the time with nothing loading is slack. A faster steady state needs less work in the math
# warpgroups, not earlier copies (`docs/kernel_notes.md`, forty-second session).

# %% [markdown]
# **Where does a launch's time go, CTA by CTA?** The traced build stamps each CTA's SM, start and
# end. At 520 query rows the prefix CTAs fill 126 of the 132 SMs, and the tree CTAs run on the rest
# while they do. At 257 nodes the prefix CTAs fill every SM, so the tree CTAs wait for them. An
# H100, recorded, not re-measured here:

# %%
s43 = data.load_json("history/session43_h100.json")
lanes = {(r["context"], r["heads"], r["nodes"]): r for r in s43["run3_trace_ctas"]["runs"]}
shown = [lanes[(32768, 8, 65)], lanes[(32768, 8, 257)]]
fig = plots.cta_lanes(shown, source=data.provenance(s43))
for r in shown:
    s, p = r["ctas"]["summary"], r["ctas"]["summary"]["prefix"]
    print(
        f"{r['context']:,} x {r['heads']} x {r['nodes']}: the launch {s['span_us']:.1f} us, the prefix CTAs end by "
        f"{p['end_last']:.1f}, the last tree CTA at {s['tree']['end_last']:.1f} ({s['later_wave']} CTAs start "
        "only after some CTA has ended)"
    )

# %% [markdown]
# At 257 nodes the tree CTAs add their whole life to the launch. At every other shape of the
# recording they end well before the prefix CTAs (`docs/kernel_notes.md`, forty-third session).
#
# **Can the tree CTAs start before the prefix CTAs end?** Only on SMs that free early. Since the
# forty-fourth session the plan keeps the split count and makes each split a few tiles longer, so
# the last split ends a tree CTA's life early and the tree CTAs run there. Timed on an H100 against
# even splits, alternating (three timings a side, medians; recorded, not re-measured here):

# %%
s44 = data.load_json("history/session44_h100.json")
print(data.provenance(s44))
print(analysis.split_length_table(s44["run2_ragged"]).round(3).to_string())

# %% [markdown]
# The plan's split is the faster at all five shapes (`plan_over_even` below 1). Where the tree CTAs
# already fit beside the prefix CTAs, the plan keeps its splits even (`specdiag.attention.plan`).

# %% [markdown]
# **Reading the numbers.** The collapse is gone: the answer above is the headline, and what the fix
# costs at page_size=1 is the `auto at page_size=1` line where that was measured. The kernel is
# not yet at FlashMLA's level nor at the floor: section 5 prints the targets and where they stand,
# section 7 how far from the floor, section 9 where the time goes. What `auto` runs where and why,
# and the kernel's history: `docs/kernel_notes.md`.
