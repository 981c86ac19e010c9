"""MLA tree-verify attention: reference, Triton page_size=1 baseline, native CUDA kernel."""

from .inputs import (
    KV_BYTES_PER_TOKEN,
    MLA_HEAD_DIM,
    MLA_V_DIM,
    VerifyInputs,
    check_verify_inputs,
    gather_prefix,
    make_verify_inputs,
    relative_error,
)
from .reference import attend, merge_partials, tree_verify_attention_ref, tree_verify_attention_split

__all__ = [
    "KV_BYTES_PER_TOKEN",
    "MLA_HEAD_DIM",
    "MLA_V_DIM",
    "VerifyInputs",
    "attend",
    "check_verify_inputs",
    "gather_prefix",
    "make_verify_inputs",
    "merge_partials",
    "relative_error",
    "tree_verify_attention_ref",
    "tree_verify_attention_split",
]
