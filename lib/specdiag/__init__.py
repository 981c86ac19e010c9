"""specdiag: investigation workbook for tree speculative decoding and MLA tree-verify attention."""

__version__ = "0.1.0"
