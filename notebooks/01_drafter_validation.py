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
# # 01 · Drafter validation: is the drafter still good at long context?
#
# Decode at 185k context ran at 0.7 tok/s. The first suspect in a speculative deployment is the
# drafter: if its sliding window, its YaRN rope scaling or its draft KV cache broke at long
# context, every step would commit ~1 token and the target would do all the work.
#
# The test: controlled prompts at 1k / 16k / 64k / 128k context, **predictable** text (a segment
# repeated: the drafter should nail it) and **free prose** (locally plausible, not predictable),
# and the **commit length** per verify step (accepted drafts + the bonus token). A healthy
# drafter keeps a flat, high curve on predictable text at every context. To show that the flat
# curve *means* something, each fault is injected on purpose and must make it collapse.
#
# The models are small but real, trained by `python -m specdiag.models.train --out data/models
# --extend-length 16384` (seed 0, under three minutes on an H200), then `python -m
# specdiag.models.train --out data/models --extend-from data/models --extend-length 65536
# --extend-steps 1000 --extend-batch 4 --extend-lr 3e-4` (98 s) and `python -m
# specdiag.models.train --out data/models --block-from data/models` (40 s; weights in
# `data/models/`). The target is a 2-layer LM with RoPE, trained the way long-context models
# are (1,024-token sequences first, then long-context stages at 16,384 and 65,536 tokens, each
# interleaved with short batches), and run with YaRN past that length.
#
# The drafter is **DFlash-style: one block-parallel pass drafts all 8 positions.** A 2-layer
# sliding-window LM (128-token window, RoPE + YaRN) encodes the committed tokens into its
# draft KV cache, which also keeps each position's final hidden state. The block pass puts 8
# mask queries on the cached window. Each query is the root's hidden state through a per-slot
# projection, and slot j attends with a **key offset**: the key at context position i is the
# hidden state at i - 1 - j, and the value is the token at i. A query whose local context
# matches the one j + 1 tokens before i therefore reads the token at i ("copy what followed
# last time"), for all 8 slots at once, with none conditioned on the drafter's own guesses.
# Those 8 distributions feed a DDTree tree of 16 nodes.
#
# For comparison, the same encoder also drafts **autoregressively** on its own (EAGLE-style:
# 8 tiny passes along its greedy path). An earlier block drafter without offset keys (lag
# embeddings summed into each context token) never learned to copy at this size. With offset
# keys, the block head learns it fast on the frozen encoder: in a CPU prototype (16 rows of
# 512 tokens per step), every slot was right on 86% of the repeated text by step 100 and on
# 93-99% by step 300.

# %% tags=["parameters"]
smoke = False
measure = "auto"  # "auto": run the sweep on a GPU if present, else recorded; "always"; "never"
models_dir = None  # None: the shipped models, data/models (found wherever the notebook runs from)
validation_file = "drafter_validation_h200.json"
new_tokens = 64
budget = 16

# %%
import json
from pathlib import Path

import pandas as pd
import torch

from specdiag import data, plots
from specdiag.models import specdec
from specdiag.models.train import load_models, training_stages

dev = "cuda" if torch.cuda.is_available() else "cpu"
models_dir = data.data_dir() / "models" if models_dir is None else Path(models_dir)
target, drafter = load_models(models_dir, dev)
log = json.loads((models_dir / "train_log.json").read_text())
stages = training_stages(log)
print(
    f"target: {sum(p.numel() for p in target.parameters()) / 1e6:.2f} M params, trained at "
    + ", then ".join(
        f"{st['length']:,} tokens ({st['steps']} steps, final loss {st['final_loss']:.3f})"
        for st in stages
        if st["model"].startswith("target")
    )
    + f"; YaRN reference length {target.cfg.train_len:,}"
)
drafters = specdec.drafters_of(drafter)  # block, and the same encoder drafting on its own
for st in stages:
    if st["model"].startswith("drafter"):
        what = "block head (encoder frozen)" if st["model"] == "drafter_block" else "encoder (LM)"
        print(f"drafter {what}: {st['length']:,}-token slices, {st['steps']} steps, final loss {st['final_loss']:.3f}")
print(
    f"drafter: {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f} M params, window "
    f"{drafter.window}, block {drafter.cfg.block}; drafting: {', '.join(drafters)}"
)
print("trained on:", data.describe_machine(log.get("machine", {})) or log.get("device"))

# %% [markdown]
# ## 1. Lossless: speculative output equals plain greedy decoding
# Checked live here, at a context small enough for any machine.

# %%
ctx_live = 600 if smoke else 2048
for kind in ("predictable", "prose"):
    p = specdec.make_prompt(kind, ctx_live, target.cfg.vocab)
    plain = specdec.greedy_generate(target, p, 32)
    for name, d in drafters.items():
        spec = specdec.speculative_generate(target, d, p, 32, budget=budget)
        print(
            f"{name:>14} drafter, {kind:>11} @ {ctx_live}: identical to greedy: "
            f"{spec.tokens == plain}; commit lengths {spec.commit_lengths}"
        )
        assert spec.tokens == plain

# %% [markdown]
# ## 2. The sweep: commit length vs context, healthy and with each fault

# %%
contexts = (1024, 4096) if smoke else (1024, 16384, 65536, 131072)


def run_sweep():
    rows = [
        r
        for d in drafters.values()
        for r in specdec.validation_sweep(
            target, d, contexts=contexts, new_tokens=16 if smoke else new_tokens, budget=budget
        )
    ]
    accuracy = [r for d in drafters.values() for r in specdec.continuation_accuracy(target, d, contexts=contexts)]
    return {"rows": rows, "accuracy": accuracy}


doc = data.measure_or_load(measure, validation_file, run_sweep)
if doc["source"] == "recorded":
    print("lossless checks recorded there:", doc.get("lossless"))
df = pd.DataFrame(doc["rows"])
table = df.pivot_table(index=["drafter", "text", "fault"], columns="context", values="mean_commit", sort=False).round(2)
table

# %%
import matplotlib.pyplot as plt

kinds_drafted = list(dict.fromkeys(df.drafter))
fig, axes = plt.subplots(len(kinds_drafted), 2, figsize=(11, 3.6 * len(kinds_drafted)), sharey=True, squeeze=False)
for row, name in zip(axes, kinds_drafted):
    for ax, kind in zip(row, ("predictable", "prose")):
        for fault, g in df[(df.text == kind) & (df.drafter == name)].groupby("fault", sort=False):
            ax.plot(g.context / 1024, g.mean_commit, "o-", label=fault, lw=3 if fault == "healthy" else 1.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (k tokens)")
        ax.set_title(f"{name} drafter, {kind} text")
        ax.grid(alpha=0.3)
    row[0].set_ylabel("mean commit length per verify step")
plots.legend_outside(axes[0, -1])
fig.suptitle(f"commit length per verify step ({data.provenance(doc)})")
fig.tight_layout()

# %% [markdown]
# **Explore.** Pick a drafter, a kind of text and the faults to compare (live in JupyterLab;
# the figure above is the whole recording). Below it, one DDTree step: the tree the best-first
# builder makes for a budget, and the path a target accepts.

# %%
from specdiag import widgets

widgets.commit_explorer(df, source=data.provenance(doc)).widget()

# %%
step = widgets.ddtree_explorer()
fig = step.static()  # budget 8: the default view
step.widget()

# %% [markdown]
# ## 3. Whose fault is a drop? Each model against the known answer
# Commit length measures how often drafter and target *agree*. On predictable text the right
# next token is known, so each model can be scored on its own (teacher-forced accuracy over the
# prompt's last 256 tokens; target with the YaRN factor the sweep used, drafter through its
# window). The block drafter is scored on its first slot (`drafter_acc`) and on all 8 slots of
# its one pass (`drafter_block_acc`).

# %%
acc = pd.DataFrame(doc["accuracy"])  # recorded in the same run as the sweep
values = ["target_acc", "drafter_acc"] + (["drafter_block_acc"] if "drafter_block_acc" in acc else []) + ["agreement"]
acc.pivot_table(index=["drafter", "context"], columns="text", values=values, sort=False).round(3)

# %% [markdown]
# ## Reading it
# Numbers below are from the recorded H200 run (`data/drafter_validation_h200.json`, both
# drafters in the same run).
# * **The healthy curve is flat.** On predictable text, the block drafter commits 9.0 of a
#   possible 9 (8 drafted + the bonus token) at 1k / 16k / 64k / 128k: every verify step
#   accepts the whole block. The autoregressive drafter commits 8.25 / 8.75 / 9.0 / 9.0.
# * **Two of the faults collapse the curve.** The **broken window** (8 tokens instead of 128:
#   the repeat no longer fits) gives 1.23-1.25 with either drafter. The **stale draft KV**
#   (committed tokens never reach the draft cache) gives 1.33-1.45 (block) and 1.16-1.23
#   (autoregressive), at every context. A flat, high healthy curve is therefore evidence that
#   the window and the draft cache work.
# * **A wrong YaRN factor is nearly invisible to this check, and how much it shows depends on
#   the drafter.** Run with factor 64, the block drafter still commits 9.0 / 8.38 / 8.38 /
#   8.75, while the autoregressive one drops to 6.1-7.1.
#   - Inside a 128-token window only short relative distances occur, and YaRN leaves the
#     short-wavelength rotary frequencies alone. What changes is the attention-logit scale
#     (0.1 ln 64 + 1 = 1.42) and the interpolated long wavelengths.
#   - The block head matches content: the query and the offset keys are hidden states from the
#     same (equally wrong) encoder. A repeat still matches itself, so the copy survives.
#   - The autoregressive drafter needs its encoder's own attention to stay sharp over 8
#     chained passes, so it loses about a fifth.
#
#   **For a postmortem:** "commit length stayed 7-8, so YaRN was fine" holds only as far as the
#   commit length depends on YaRN. Check the drafter's `rope_scaling` against its training
#   config directly. The window and the draft cache, by contrast, are proven by the curve.
# * **The accuracy table splits agreement into each model's own score.** On the repeat both
#   models are right at every context: target 100%; block drafter 100% on its first slot and
#   on all 8 slots of its one pass; autoregressive drafter 99.6-100%. It also explains the
#   earlier toy's false alarm. With a target trained only to 16k, the healthy curve fell to
#   5.4 at 64k and 4.5 at 128k. The drafter's accuracy was unchanged, while the target,
#   stretched 4x and 8x by YaRN, missed the same 2 offsets of every 37-token period (94.5%): the
#   two tokens of the period that occur twice, whose continuation needs more than one token of
#   context. No attention temperature repaired those misses (0.89 at a logit scale of 1.0,
#   0.945 at 1.14 and 1.3, 0.54 at 1.5). A further long-context stage at 64k did (100% at 64k
#   and 128k). Earlier still, a target trained at 1,024 tokens only fell to 78% at 16k and 22%
#   at 128k. A drop that the drafter's own accuracy does not share is not a drafter fault:
#   rule out the target first when a toy reproduction "collapses".
# * In the deployment, the measured commit length on predictable text stayed at 7-8 at every
#   context: the healthy signature. The sliding window and the draft KV cache were fine. YaRN
#   (fine too in the deployment's story) is the one to confirm from the config, since this check
#   barely sees it. And no drafter fault explains the symptom itself: a drafter fault lowers the
#   tokens per step, while here the *step time* grew 9x (159 ms at 32k to 1430 ms at 185k) at an
#   unchanged commit length. The collapse had to be somewhere else (notebooks 02-05).
