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

__all__ = [
    "PageSizeConstraint",
    "BackendMask",
    "scan_engine",
    "find_installed_engine",
    "page_size_constraints",
    "backend_masks",
    "declared_mla_backends",
]

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
            has_ps = any(
                isinstance(s, (ast.Name, ast.Attribute))
                and (getattr(s, "id", None) or getattr(s, "attr", None)) == "page_size"
                for s in sides
            )
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
                self.found.append(
                    PageSizeConstraint(
                        self.rel,
                        node.lineno,
                        self.func[-1] if self.func else "<module>",
                        algos,
                        tree,
                        ast.unparse(node.test),
                        action,
                        message[:300],
                    )
                )
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


_BACKEND_ALIASES = {"fa3": "flashattention", "fa4": "flashattention"}


def declared_mla_backends(root: str | Path, include_tests: bool = False) -> dict[str, str]:
    """Backends the engine itself lists as valid for MLA: ``attention_backend in [...]`` checks
    under an ``if`` about MLA (``use_mla_backend``...). Returns {backend: "file:line"}."""
    root = Path(root)
    found: dict[str, str] = {}

    def walk(node, in_mla, rel):
        for child in ast.iter_child_nodes(node):
            mla_here = in_mla
            if isinstance(child, ast.If) and any("mla" in n.lower() for n in _names(child.test)):
                mla_here = True
            if mla_here and isinstance(child, ast.Compare) and any(isinstance(op, ast.In) for op in child.ops):
                if "attention_backend" in _names(child.left):
                    for comp in child.comparators:
                        if isinstance(comp, (ast.List, ast.Tuple, ast.Set)):
                            for elt in comp.elts:
                                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                                    name = _BACKEND_ALIASES.get(elt.value, elt.value)
                                    found.setdefault(name, f"{rel}:{child.lineno}")
            walk(child, mla_here, rel)

    for path in sorted(root.rglob("*.py")):
        if not include_tests and _is_test(path, root):
            continue
        text = path.read_text(errors="replace")
        if "attention_backend" not in text or "mla" not in text.lower():
            continue
        tree = _parse(path)
        if tree is not None:
            walk(tree, False, str(path.relative_to(root)))
    return found


def backend_masks(root: str | Path, include_tests: bool = False) -> list[BackendMask]:
    """One row per module in an ``attention`` folder whose name ends in ``_backend``.

    A backend counts as MLA-capable by its file name, by MLA names in its code, or when the
    engine lists it as a valid MLA backend (``declared_mla_backends``). Backends whose module
    name repeats in another folder are labelled with that folder.
    """
    root = Path(root)
    declared = declared_mla_backends(root, include_tests)
    paths = [
        p
        for p in sorted(root.rglob("*_backend.py"))
        if "attention" in p.parts and (include_tests or not _is_test(p, root))
    ]
    stems = [p.stem for p in paths]
    rows = []
    for path in paths:
        tree = _parse(path)
        if tree is None:
            continue
        name = path.stem.removesuffix("_backend")
        mask_lines = sorted(
            {
                n.lineno
                for n in ast.walk(tree)
                if hasattr(n, "lineno")
                and _names(n) & _MASK_NAMES
                and isinstance(n, (ast.Attribute, ast.Name, ast.arg, ast.keyword))
            }
        )
        mla_hits = sorted(_names(tree) & _MLA_NAMES)
        if "mla" in path.stem.lower():
            evidence = "file name"
        elif mla_hits:
            evidence = ", ".join(mla_hits)
        elif name in declared:
            evidence = f"listed as an MLA backend at {declared[name]}"
        else:
            evidence = ""
        label = name if stems.count(path.stem) == 1 else f"{name} [{path.relative_to(root).parent}]"
        rows.append(BackendMask(label, str(path.relative_to(root)), mask_lines, bool(evidence), evidence))
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
