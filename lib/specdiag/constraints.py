"""Source constraint check: read a serving engine's installed source with ``ast``.

Two questions, answered with file and line so a postmortem can cite them:

1. **Which speculative paths force page_size = 1?**  Every ``if`` whose test compares a
   ``page_size`` against 1 and whose body raises, asserts or resets ``page_size``; the
   speculative algorithm it guards is read from the enclosing function's name
   (``_handle_eagle_family``), string constants in the enclosing tests
   (``speculative_algorithm == "EAGLE"``) or the message, and tree-shaped drafts from
   ``topk > 1`` / ``num_draft_tokens`` conditions.
2. **Which attention backends accept a custom (tree) mask, and which of those do MLA?**
   Per module under ``layers/attention``: does it read a ``custom_mask``; does it handle MLA
   (file name, or ``kv_lora_rank`` / ``use_mla`` in its code).

``scan_engine(root)`` takes the package folder (``.../site-packages/sglang``). Install the
engine without its dependencies into a scratch folder to scan it, e.g.
``pip install --no-deps --target /tmp/sgl sglang==0.5.23``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["PageSizeConstraint", "BackendMask", "scan_engine", "find_installed_engine", "page_size_constraints", "backend_masks"]

_ALGOS = re.compile(r"\b(EAGLE3?|NGRAM|DFLASH|DDTREE|MEDUSA|LOOKAHEAD|STANDALONE|NEXTN|MTP)\b", re.I)
_MLA_NAMES = {"kv_lora_rank", "use_mla", "is_mla", "qk_rope_head_dim"}
_MASK_NAMES = {"custom_mask"}


@dataclass
class PageSizeConstraint:
    file: str
    line: int
    function: str
    algorithms: list[str]
    tree_drafts: bool  # the condition involves topk > 1 / multiple draft branches
    condition: str
    action: str  # raise | assert | reset page_size | warn
    message: str


@dataclass
class BackendMask:
    backend: str
    file: str
    custom_mask_lines: list[int]
    mla: bool
    mla_evidence: str

    @property
    def accepts_custom_mask(self) -> bool:
        return bool(self.custom_mask_lines)


def _names(node) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
    return out


def _strings(node) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _compares_page_size_to_one(test) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            has_ps = any(isinstance(s, (ast.Name, ast.Attribute)) and (getattr(s, "id", None) or getattr(s, "attr", None)) == "page_size" for s in sides)
            has_one = any(isinstance(s, ast.Constant) and s.value == 1 for s in sides)
            if has_ps and has_one:
                return True
    return False


def _action(body) -> tuple[str | None, str]:
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Raise):
                return "raise", " ".join(_strings(n))
            if isinstance(n, ast.Assert):
                return "assert", " ".join(_strings(n))
            if isinstance(n, (ast.Assign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any((getattr(t, "attr", None) or getattr(t, "id", None)) == "page_size" for t in targets):
                    return "reset page_size", ast.unparse(n)
            if isinstance(n, ast.keyword) and n.arg == "page_size":
                return "reset page_size", ast.unparse(n)
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") in ("warning", "warn"):
                return "warn", " ".join(_strings(n))
    return None, ""


class _Visitor(ast.NodeVisitor):
    def __init__(self, rel: str):
        self.rel = rel
        self.func: list[str] = []
        self.tests: list[ast.AST] = []
        self.found: list[PageSizeConstraint] = []

    def visit_FunctionDef(self, node):
        self.func.append(node.name)
        self.generic_visit(node)
        self.func.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):
        if _compares_page_size_to_one(node.test):
            action, message = _action(node.body)
            if action:
                context = [*self.tests, node.test]
                funcs = " ".join(self.func).replace("_", " ")
                text = " ".join([funcs, message, *(" ".join(_strings(t)) for t in context)])
                algos = sorted({m.upper() for m in _ALGOS.findall(text)})
                names = set().union(*(_names(t) for t in context))
                tree = any("topk" in n for n in names) or bool(re.search(r"topk\s*>\s*1|tree", text, re.I))
                self.found.append(PageSizeConstraint(self.rel, node.lineno, self.func[-1] if self.func else "<module>", algos, tree, ast.unparse(node.test), action, message[:300]))
        self.tests.append(node.test)
        for stmt in node.body:
            self.visit(stmt)
        self.tests.pop()
        for stmt in node.orelse:
            self.visit(stmt)


def _parse(path: Path):
    try:
        return ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError:
        return None


def _is_test(path: Path, root: Path) -> bool:
    return any(part in ("test", "tests") for part in path.relative_to(root).parts[:-1])


def page_size_constraints(root: str | Path, include_tests: bool = False) -> list[PageSizeConstraint]:
    root = Path(root)
    out = []
    for path in sorted(root.rglob("*.py")):
        if not include_tests and _is_test(path, root):
            continue
        tree = _parse(path)
        if tree is None or "page_size" not in ast.dump(tree):
            continue
        v = _Visitor(str(path.relative_to(root)))
        v.visit(tree)
        out.extend(v.found)
    return out


def backend_masks(root: str | Path) -> list[BackendMask]:
    """One row per module in an ``attention`` folder whose name ends in ``_backend``."""
    root = Path(root)
    rows = []
    for path in sorted(root.rglob("*_backend.py")):
        if "attention" not in path.parts:
            continue
        tree = _parse(path)
        if tree is None:
            continue
        mask_lines = sorted({n.lineno for n in ast.walk(tree) if hasattr(n, "lineno") and _names(n) & _MASK_NAMES and isinstance(n, (ast.Attribute, ast.Name, ast.arg, ast.keyword))})
        mla_hits = sorted(_names(tree) & _MLA_NAMES)
        is_mla = "mla" in path.stem.lower() or bool(mla_hits)
        evidence = "file name" if "mla" in path.stem.lower() else (", ".join(mla_hits) if mla_hits else "")
        rows.append(BackendMask(path.stem.removesuffix("_backend"), str(path.relative_to(root)), mask_lines, is_mla, evidence))
    return rows


def find_installed_engine(name: str = "sglang") -> Path | None:
    spec = importlib.util.find_spec(name) if importlib.util.find_spec is not None else None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _version(root: Path) -> str:
    dist = sorted(root.parent.glob(f"{root.name}-*.dist-info"))
    if dist:
        return dist[-1].name[len(root.name) + 1 : -len(".dist-info")]
    for cand in (root / "version.py", root / "__init__.py"):
        if cand.is_file():
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", cand.read_text(errors="replace"))
            if m:
                return m.group(1)
    return "unknown"


def scan_engine(root: str | Path) -> dict:
    """Both tables for one engine folder, as plain data (JSON-ready)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"engine source folder not found: {root}")
    cons = page_size_constraints(root)
    masks = backend_masks(root)
    return {
        "engine": root.name,
        "version": _version(root),
        "page_size_constraints": [asdict(c) for c in cons],
        "backends": [dict(asdict(b), accepts_custom_mask=b.accepts_custom_mask) for b in masks],
    }
