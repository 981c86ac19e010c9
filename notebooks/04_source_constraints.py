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
# # 04 · Source constraint check: why does the engine run *that* kernel?
#
# Notebook 03 showed a step time ~300x above the bandwidth floor, and notebook 02 a GPU that
# is "99% utilized" while almost idle. The last question before writing a fix: **why is the
# slow kernel the one that runs?** The answer is in the serving engine's source, and this
# notebook reads it with `ast`, citing file and line:
#
# 1. tree-shaped drafts (top-k > 1, DDTree's case) need **page_size = 1**: accepted tree nodes
#    are not contiguous in the KV cache, so paged layouts are rejected or demoted;
# 2. of the attention backends, few accept a **custom (tree) mask**, and of those few handle
#    **MLA**: for an MLA model that leaves the Triton backend, whose extend kernel runs one CTA
#    per head at batch 1 and walks the whole prefix with per-token gathers (notebooks 03/05).

# %% tags=["parameters"]
smoke = False
measure = "auto"  # "auto": scan an installed engine if there is one, else recorded; "always"; "never"
engine_dirs = []  # extra engine folders to scan, e.g. ["/tmp/sgl-0.5.23/sglang"]
recorded_file = "constraints_sglang.json"

# %%
import pandas as pd

from specdiag import constraints, data

installed = constraints.find_installed_engine("sglang")
folders = [*engine_dirs, *([str(installed)] if installed else [])]


def scan():
    scans = [constraints.scan_engine(f) for f in folders]
    for f, s in zip(folders, scans):
        print(f"scanned {f} (version {s['version']})")
    return {"scans": scans}


doc = data.measure_or_load(
    measure,
    recorded_file,
    scan,
    available=lambda: bool(folders),
    needs="a serving engine's source (pip install --no-deps --target DIR sglang, then pass engine_dirs)",
)
scans = doc["scans"]
if doc["source"] == "recorded":
    print("scanned by:", doc["how"])

# %% [markdown]
# ## 1. Speculative paths that constrain page_size
# Only constraints tied to a speculative algorithm or to tree-shaped drafts are shown.

# %%
rows = []
for s in scans:
    for c in s["page_size_constraints"]:
        if c["algorithms"] or c["tree_drafts"]:
            rows.append(
                {
                    "version": s["version"],
                    "algorithms": ", ".join(c["algorithms"]) or "(tree drafts)",
                    "tree drafts": c["tree_drafts"],
                    "action": c["action"],
                    "where": f"{c['file']}:{c['line']}",
                    "function": c["function"],
                    "condition": c["condition"][:110],
                }
            )
spec = pd.DataFrame(rows)
spec

# %% [markdown]
# ## 2. Attention backends: custom mask x MLA

# %%
brows = []
for s in scans:
    for b in s["backends"]:
        if b["accepts_custom_mask"] or b["mla"]:
            brows.append(
                {
                    "version": s["version"],
                    "backend": b["backend"],
                    "custom mask": b["accepts_custom_mask"],
                    "MLA": b["mla"],
                    "mask read at": ", ".join(map(str, b["custom_mask_lines"][:4])),
                    "MLA evidence": b["mla_evidence"],
                    "file": b["file"],
                }
            )
backends = pd.DataFrame(brows)
pivot = backends.pivot_table(index="backend", columns="version", values=["custom mask", "MLA"], aggfunc="first")
pivot

# %%
for s in scans:
    both = [b["backend"] for b in s["backends"] if b["accepts_custom_mask"] and b["mla"]]
    fast_mla = [b["backend"] for b in s["backends"] if b["mla"] and not b["accepts_custom_mask"]]
    tree = [c for c in s["page_size_constraints"] if c["tree_drafts"]]
    print(f"sglang {s['version']}:")
    print(f"  tree-draft constraints on page_size: {len(tree)} ({', '.join(sorted({c['action'] for c in tree}))})")
    print(f"  custom mask AND MLA: {', '.join(both) or 'none'}")
    print(f"  MLA without a custom mask: {', '.join(fast_mla) or 'none'}")

# %% [markdown]
# ## Reading it
# * In every version scanned, tree-shaped drafts (top-k > 1) and page_size > 1 do not go
#   together freely: older versions demote the tree (top-k forced back to 1, with a warning),
#   newer ones raise unless the backend is on a short list. A tree-drafting deployment that
#   wants its tree therefore runs at **page_size = 1**.
# * The MLA backends built for decode speed appear in the "MLA without a custom mask" line:
#   they cannot run a tree verify. Per the postmortem, the deployment's DDTree path allowed only the
#   Triton backend for MLA tree verify, whose extend kernel is the baseline of notebooks 03
#   and 05; which other backends *could* take the mask differs by version, as the table shows.
# * The fix in notebook 05 removes the coupling: the prefix needs **no** mask at all (every tree
#   node sees all of it), so it can be read as contiguous pages at any page size and split
#   across all SMs; only the small tree block carries the ancestor mask.
