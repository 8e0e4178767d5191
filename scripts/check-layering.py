#!/usr/bin/env python3
"""Checks lake's layering: crates in the declared layer order, and no import cycles between files.

    python3 scripts/check-layering.py            # report; exit 1 on a violation
    python3 scripts/check-layering.py --dot      # the crate graph in Graphviz dot (exit 0)
    python3 scripts/check-layering.py --edges    # the report plus every file-level import edge

Crate level: the members of the root Cargo.toml's `[workspace] members`, and the workspace
crates each one lists under `[dependencies]` (and `[target.*.dependencies]`; never
dev- or build-dependencies), must form no cycle and must respect LAYERS below: a crate may
depend only on crates earlier in the list. A member missing from LAYERS is an error.

File level: in each crate's `src/`, the module files (found by following `mod x;` from each
crate root: lib.rs, main.rs, src/bin/*) must not import each other in a cycle. An import is a
`crate::…`, `super::…`, `self::…` path, or a path through a child module or a `use`d name, in
`use` declarations or anywhere in code (comments and string literals are skipped). It goes to
the file of the longest module prefix of the path; a name that module only re-exports
(`pub use child::Name;`) is followed to the module that defines it (--no-follow-reexports
turns that off). `mod x;` is containment, not an import. Imports inside `#[cfg(test)]` /
`mod tests` modules are ignored.

Python 3.11, standard library only.  Exit status: 0 clean, 1 violations, 2 usage/read error.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

# The workspace's layers (docs/architecture.md), bottom first: data flows up this order and
# earlier entries never import later ones. `stats` sits above `loader`: `lake stats --images`
# decodes frames through the loader, and the dataset-level statistics reuse ingest's exact
# feature statistics. `testkit` is test support and comes last: nothing may list it under
# [dependencies]. Names are crate names without `lake-` (`lake` itself is the CLI). Crates that
# do not exist yet are simply skipped.
LAYERS = [
    "schemas",
    "store",
    "codec",
    "gpu",
    "ingest",
    "loader",
    "stats",
    "query",
    "export",
    "client",
    "serve",
    "trainer",
    "lake",
    "testkit",
]

MAX_CYCLES_PER_GROUP = 60  # simple cycles listed per strongly connected group


# ---------------------------------------------------------------------------------------------
# Crate level
# ---------------------------------------------------------------------------------------------


@dataclass
class Crate:
    name: str  # package name, e.g. lake-store
    short: str  # layer name, e.g. store
    dir: Path
    manifest: dict
    deps: dict[str, str] = field(default_factory=dict)  # package name -> the table it came from


def short_name(package: str) -> str:
    return package[len("lake-") :] if package.startswith("lake-") else package


def read_toml(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def workspace_members(root: Path, manifest: dict, problems: list[str]) -> list[Path]:
    ws = manifest.get("workspace")
    if not isinstance(ws, dict):
        problems.append(f"{root / 'Cargo.toml'}: no [workspace] table")
        return []
    excluded = {(root / e).resolve() for e in ws.get("exclude", [])}
    dirs: list[Path] = []
    for pattern in ws.get("members", []):
        matches = sorted(glob.glob(str(root / pattern))) if glob.has_magic(pattern) else [str(root / pattern)]
        if not matches:
            problems.append(f"workspace member pattern {pattern!r} matches nothing")
        for m in matches:
            p = Path(m).resolve()
            if p not in excluded and p not in dirs:
                dirs.append(p)
    return dirs


def dependency_tables(manifest: dict) -> list[tuple[str, dict]]:
    """[dependencies] and [target.<cfg>.dependencies]; never dev- or build-dependencies."""
    tables = []
    if isinstance(manifest.get("dependencies"), dict):
        tables.append(("dependencies", manifest["dependencies"]))
    for cfg, t in (manifest.get("target") or {}).items():
        if isinstance(t, dict) and isinstance(t.get("dependencies"), dict):
            tables.append((f"target.{cfg}.dependencies", t["dependencies"]))
    return tables


def load_crates(root: Path, problems: list[str], warnings: list[str]) -> tuple[dict[str, Crate], dict[str, set[str]]]:
    """Members by package name, and package name -> the lake crates it depends on."""
    try:
        root_manifest = read_toml(root / "Cargo.toml")
    except (OSError, tomllib.TOMLDecodeError) as e:
        problems.append(f"cannot read {root / 'Cargo.toml'}: {e}")
        return {}, {}
    ws_deps = (root_manifest.get("workspace") or {}).get("dependencies") or {}
    crates: dict[str, Crate] = {}
    by_dir: dict[Path, str] = {}
    for d in workspace_members(root, root_manifest, problems):
        mpath = d / "Cargo.toml"
        try:
            manifest = read_toml(mpath)
        except (OSError, tomllib.TOMLDecodeError) as e:
            problems.append(f"workspace member {rel(d, root)}: cannot read Cargo.toml: {e}")
            continue
        name = (manifest.get("package") or {}).get("name")
        if not isinstance(name, str):
            problems.append(f"{rel(mpath, root)}: no [package] name")
            continue
        crates[name] = Crate(name, short_name(name), d, manifest)
        by_dir[d] = name

    graph: dict[str, set[str]] = {}
    for c in crates.values():
        graph[c.name] = set()
        for table_name, table in dependency_tables(c.manifest):
            for key, spec in table.items():
                package = key
                path = None
                if isinstance(spec, dict):
                    if spec.get("workspace") is True and isinstance(ws_deps.get(key), dict):
                        package = ws_deps[key].get("package", key)
                        if "path" in ws_deps[key]:
                            path = (root / ws_deps[key]["path"]).resolve()
                    package = spec.get("package", package)
                    if "path" in spec:
                        path = (c.dir / spec["path"]).resolve()
                if path is not None and path in by_dir:
                    package = by_dir[path]
                if package in crates or package == "lake" or package.startswith("lake-"):
                    if package == c.name:
                        continue
                    graph[c.name].add(package)
                    c.deps.setdefault(package, table_name)
                    if package not in crates:
                        warnings.append(
                            f"{c.name} depends on {package} ([{table_name}]), which is not a workspace member"
                        )
    return crates, graph


def check_crates(crates: dict[str, Crate], graph: dict[str, set[str]], root: Path) -> tuple[list[str], set[tuple[str, str]]]:
    errors: list[str] = []
    bad_edges: set[tuple[str, str]] = set()
    rank = {n: i for i, n in enumerate(LAYERS)}
    for c in sorted(crates.values(), key=lambda c: c.name):
        if c.short not in rank:
            errors.append(
                f"crate {c.name} ({rel(c.dir, root)}/) is not in the layer order: add {c.short!r} to LAYERS in "
                f"scripts/check-layering.py (and a row to DESIGN.md's Workspace table) at its layer"
            )
    for a in sorted(graph):
        for b in sorted(graph[a]):
            sa, sb = short_name(a), short_name(b)
            if sa in rank and sb in rank and rank[sb] >= rank[sa]:
                bad_edges.add((a, b))
                errors.append(
                    f"{a} depends on {b} ([{crates[a].deps.get(b, 'dependencies')}] of "
                    f"{rel(crates[a].dir / 'Cargo.toml', root)}), but {sb!r} is not below {sa!r} in the layer order "
                    f"(layer {rank[sb]} >= {rank[sa]}): lower layers never import higher ones"
                )
    for group in strongly_connected(graph):
        cycles, _ = simple_cycles(group, graph, MAX_CYCLES_PER_GROUP)
        for cyc in cycles:
            errors.append("crate dependency cycle: " + " -> ".join(cyc + [cyc[0]]))
            for x, y in zip(cyc, cyc[1:] + cyc[:1]):
                bad_edges.add((x, y))
    return errors, bad_edges


def crate_dot(crates: dict[str, Crate], graph: dict[str, set[str]], bad: set[tuple[str, str]]) -> str:
    rank = {n: i for i, n in enumerate(LAYERS)}
    out = [
        "digraph lake_crates {",
        "  // An edge A -> B: A lists B under [dependencies]. Red: against the layer order or in a cycle.",
        '  graph [rankdir=TB, label="lake workspace crates (lower layers at the bottom)", labelloc=t];',
        "  node [shape=box, style=rounded, fontname=Helvetica];",
    ]
    nodes = set(graph) | {b for deps in graph.values() for b in deps}
    for n in sorted(nodes, key=lambda n: (rank.get(short_name(n), 99), n)):
        layer = rank.get(short_name(n))
        label = f"{n}\\nlayer {layer}" if layer is not None else f"{n}\\nnot in LAYERS"
        attrs = [f'label="{label}"']
        if n not in crates:
            attrs.append('style="rounded,dashed"')
        if layer is None:
            attrs.append("color=red")
        out.append(f'  "{n}" [{", ".join(attrs)}];')
    for a in sorted(graph):
        for b in sorted(graph[a]):
            style = " [color=red, penwidth=2]" if (a, b) in bad else ""
            out.append(f'  "{a}" -> "{b}"{style};')
    out.append("}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Rust lexing: identifiers, punctuation and literals; comments dropped, strings opaque
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Tok:
    kind: str  # "id", "p" (punctuation), "lit", "life"
    val: str
    line: int
    raw: bool = False  # r#ident


IDENT_RE = re.compile(r"[^\W\d]\w*")
NUM_RE = re.compile(r"\d[\w]*(?:\.\d[\w]*)?")
RAW_STR_RE = re.compile(r'(?:b|c)?r(#*)"')


def lex(text: str) -> list[Tok]:
    toks: list[Tok] = []
    i, n, line = 0, len(text), 1
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
            continue
        if ch.isspace():
            i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):  # block comments nest in Rust
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            line += text.count("\n", i, j)
            i = j
            continue
        m = RAW_STR_RE.match(text, i)
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            j = n if j < 0 else j + len(close)
            toks.append(Tok("lit", text[m.end() : max(m.end(), j - len(close))], line))
            line += text.count("\n", i, j)
            i = j
            continue
        if ch == '"' or (ch in "bc" and text.startswith('"', i + 1) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_"))):
            start = i + (1 if ch == '"' else 2)
            j = start
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            toks.append(Tok("lit", text[start:j], line))
            line += text.count("\n", i, j)
            i = j + 1
            continue
        if ch == "b" and text.startswith("'", i + 1):
            i += 1
            ch = "'"
        if ch == "'":
            if text.startswith("\\", i + 1):  # '\n', '\'', '\u{..}'
                j = text.find("'", i + 3)
                i = n if j < 0 else j + 1
                toks.append(Tok("lit", "'", line))
                continue
            if i + 2 < n and text[i + 2] == "'":  # 'a'
                toks.append(Tok("lit", text[i + 1], line))
                i += 3
                continue
            m = IDENT_RE.match(text, i + 1)  # 'lifetime / 'label
            if m:
                toks.append(Tok("life", m.group(0), line))
                i = m.end()
                continue
            toks.append(Tok("p", "'", line))
            i += 1
            continue
        if ch == "r" and text.startswith("r#", i) and IDENT_RE.match(text, i + 2):
            m = IDENT_RE.match(text, i + 2)
            toks.append(Tok("id", m.group(0), line, raw=True))
            i = m.end()
            continue
        m = IDENT_RE.match(text, i)
        if m:
            toks.append(Tok("id", m.group(0), line))
            i = m.end()
            continue
        if ch.isdigit():
            m = NUM_RE.match(text, i)
            toks.append(Tok("lit", m.group(0), line))
            i = m.end()
            continue
        if text.startswith("::", i):
            toks.append(Tok("p", "::", line))
            i += 2
            continue
        toks.append(Tok("p", ch, line))
        i += 1
    return toks


# ---------------------------------------------------------------------------------------------
# Rust parsing, just enough: module declarations, items defined, `use` trees, paths
# ---------------------------------------------------------------------------------------------

Scope = tuple[str, ...]  # inline module path inside one file, () for the file's own module


@dataclass
class ModDecl:  # `mod name;`
    name: str
    scope: Scope
    line: int
    test: bool
    path_attr: str | None


@dataclass
class UseLeaf:  # one leaf of a `use` tree
    segs: tuple[str, ...]  # as written ("::" first for an extern path)
    glob: bool
    bind: str | None  # the name it binds (None for globs and `as _`)
    scope: Scope
    line: int
    test: bool
    module_level: bool


@dataclass
class PathRef:  # a path `a::b::c` in code
    segs: tuple[str, ...]
    scope: Scope
    line: int
    test: bool


@dataclass
class ParsedFile:
    path: Path
    test: bool = False  # #![cfg(test)]
    decls: list[ModDecl] = field(default_factory=list)
    inline: dict[Scope, bool] = field(default_factory=dict)  # inline module -> test
    defs: dict[Scope, set[str]] = field(default_factory=dict)
    uses: list[UseLeaf] = field(default_factory=list)
    refs: list[PathRef] = field(default_factory=list)


DEF_KEYWORDS = {"fn", "struct", "enum", "trait", "type", "const", "static", "union"}
TEST_WORD = re.compile(r"(?<!\w)test(?!\w)")


def attr_is_cfg_test(text: str) -> bool:
    return text.startswith("cfg(") and bool(TEST_WORD.search(text)) and "not(" not in text


def parse_rust(path: Path, text: str) -> ParsedFile:
    toks = lex(text)
    pf = ParsedFile(path)
    n = len(toks)
    # Brace stack: [kind, name, test]; kind "mod" for an inline module's body, "blk" otherwise.
    stack: list[list] = []
    attrs: list[str] = []  # outer attributes waiting for their item

    def tok(k: int) -> Tok | None:
        return toks[k] if 0 <= k < n else None

    def is_p(k: int, v: str) -> bool:
        t = tok(k)
        return t is not None and t.kind == "p" and t.val == v

    def is_kw(k: int, v: str) -> bool:
        t = tok(k)
        return t is not None and t.kind == "id" and not t.raw and t.val == v

    def scope() -> Scope:
        return tuple(e[1] for e in stack if e[0] == "mod")

    def in_test() -> bool:
        return pf.test or any(e[2] for e in stack if e[0] == "mod")

    def module_level() -> bool:
        return not stack or stack[-1][0] == "mod"

    def balanced(k: int, open_: str, close: str) -> int:
        """Index just past the bracket that closes the one at k."""
        depth = 0
        while k < n:
            if is_p(k, open_):
                depth += 1
            elif is_p(k, close):
                depth -= 1
                if depth == 0:
                    return k + 1
            k += 1
        return n

    def parse_use_tree(k: int, prefix: tuple[str, ...], out: list[tuple[tuple[str, ...], bool, str | None, int]]) -> int:
        segs = list(prefix)
        if is_p(k, "::"):
            if not segs:
                segs.append("::")
            k += 1
        while k < n:
            t = toks[k]
            if t.kind == "id":
                k += 1
                if is_p(k, "::"):
                    segs.append(t.val)
                    k += 1
                    continue
                if t.val == "self" and not t.raw:
                    target, bind = tuple(segs), (segs[-1] if segs else None)
                else:
                    target, bind = tuple(segs) + (t.val,), t.val
                if is_kw(k, "as") and tok(k + 1) is not None and tok(k + 1).kind == "id":
                    bind = tok(k + 1).val
                    k += 2
                elif is_kw(k, "as") and is_p(k + 1, "_"):
                    bind = None
                    k += 2
                out.append((target, False, bind, t.line))
                return k
            if t.kind == "p" and t.val == "*":
                out.append((tuple(segs), True, None, t.line))
                return k + 1
            if t.kind == "p" and t.val == "{":
                k += 1
                while k < n and not is_p(k, "}"):
                    before = k
                    k = parse_use_tree(k, tuple(segs), out)
                    if is_p(k, ","):
                        k += 1
                    elif k == before:
                        k += 1
                return k + 1
            return k
        return k

    i = 0
    while i < n:
        t = toks[i]
        if t.kind == "p":
            v = t.val
            if v == "#":
                inner = is_p(i + 1, "!")
                j = i + 2 if inner else i + 1
                if is_p(j, "["):
                    end = balanced(j, "[", "]")
                    text_ = "".join(x.val if x.kind != "lit" else repr(x.val) for x in toks[j + 1 : end - 1])
                    if inner:
                        if attr_is_cfg_test(text_):
                            if not stack:
                                pf.test = True
                            elif stack[-1][0] == "mod":
                                stack[-1][2] = True
                                pf.inline[scope()] = True
                    else:
                        attrs.append(text_)
                        m = re.fullmatch(r"path='(.*)'", text_)
                        if m:
                            attrs.append("__path__" + m.group(1))
                    i = end
                    continue
            elif v == "{":
                stack.append(["blk", None, False])
                attrs.clear()
            elif v == "}":
                if stack:
                    stack.pop()
                attrs.clear()
            elif v == ";":
                attrs.clear()
            i += 1
            continue
        if t.kind != "id":
            i += 1
            continue
        if not t.raw and t.val == "mod" and tok(i + 1) is not None and tok(i + 1).kind == "id":
            name = tok(i + 1).val
            test = name == "tests" or any(attr_is_cfg_test(a) for a in attrs) or in_test()
            if is_p(i + 2, "{"):
                stack.append(["mod", name, test])
                pf.inline[scope()] = test
                attrs.clear()
                i += 3
                continue
            if is_p(i + 2, ";"):
                path_attr = next((a[len("__path__") :] for a in attrs if a.startswith("__path__")), None)
                pf.decls.append(ModDecl(name, scope(), t.line, test, path_attr))
                attrs.clear()
                i += 3
                continue
        if not t.raw and t.val == "use":
            leaves: list = []
            j = parse_use_tree(i + 1, (), leaves)
            for segs, is_glob, bind, line in leaves:
                pf.uses.append(UseLeaf(segs, is_glob, bind, scope(), line, in_test(), module_level()))
            while j < n and not is_p(j, ";") and not is_p(j, "}"):
                j += 1
            if is_p(j, ";"):
                j += 1
            attrs.clear()
            i = j
            continue
        if module_level() and not t.raw:
            if t.val in DEF_KEYWORDS and tok(i + 1) is not None and tok(i + 1).kind == "id":
                k = i + 1
                if tok(k).val == "mut" and not tok(k).raw:
                    k += 1
                if tok(k) is not None and tok(k).kind == "id" and tok(k).val not in DEF_KEYWORDS | {"mut"}:
                    pf.defs.setdefault(scope(), set()).add(tok(k).val)
                    i = k + 1
                    continue
            if t.val == "macro_rules" and is_p(i + 1, "!") and tok(i + 2) is not None and tok(i + 2).kind == "id":
                pf.defs.setdefault(scope(), set()).add(tok(i + 2).val)
                i += 3
                continue
        # A path a::b::c in code: not a continuation (`x::a`), not `$crate::`, not `pub(in a::b)`.
        if is_p(i + 1, "::") and tok(i + 2) is not None and tok(i + 2).kind == "id":
            prev = tok(i - 1)
            continuation = prev is not None and prev.kind == "p" and prev.val in ("::", "$")
            visibility = is_kw(i - 1, "in") and is_p(i - 2, "(") and is_kw(i - 3, "pub")
            segs = [t.val]
            j = i + 1
            while is_p(j, "::") and tok(j + 1) is not None and tok(j + 1).kind == "id":
                segs.append(tok(j + 1).val)
                j += 2
            if not continuation and not visibility:
                pf.refs.append(PathRef(tuple(segs), scope(), t.line, in_test()))
            i = j
            continue
        i += 1
    return pf


# ---------------------------------------------------------------------------------------------
# Module trees and the file graph
# ---------------------------------------------------------------------------------------------

ModPath = tuple[str, ...]


@dataclass
class Module:
    file: Path
    scope: Scope  # inline path inside the file; () for the file's own module
    test: bool


@dataclass
class Edge:
    src: Path
    dst: Path
    line: int
    text: str


class Target:
    """One crate root (lib, a bin) and the module files it reaches through `mod x;`."""

    def __init__(self, crate: str, kind: str, root_file: Path, parse, warnings: list[str], ws_root: Path, follow: bool):
        self.crate, self.kind, self.root_file = crate, kind, root_file
        self.parse, self.warnings, self.ws_root, self.follow = parse, warnings, ws_root, follow
        self.modules: dict[ModPath, Module] = {}
        self.file_mod: dict[Path, ModPath] = {}
        self.file_test: dict[Path, bool] = {}
        self._load(root_file, (), root_file.parent, False)
        self._children: dict[ModPath, set[str]] = {}
        for p in self.modules:
            if p:
                self._children.setdefault(p[:-1], set()).add(p[-1])
        self._alias_memo: dict[tuple[ModPath, str], ModPath | None] = {}

    def _load(self, file: Path, modpath: ModPath, children_dir: Path, test: bool) -> None:
        if file in self.file_mod:
            self.warnings.append(f"{rel(file, self.ws_root)} is declared as a module twice in {self.label()}")
            return
        pf = self.parse(file)
        if pf is None:
            return
        test = test or pf.test or (bool(modpath) and modpath[-1] == "tests")
        self.file_mod[file] = modpath
        self.file_test[file] = test
        self.modules[modpath] = Module(file, (), test)
        for sc, sc_test in pf.inline.items():
            self.modules[modpath + sc] = Module(file, sc, test or sc_test)
        for d in pf.decls:
            base = children_dir.joinpath(*d.scope)
            if d.path_attr is not None:
                anchor = file.parent if not d.scope else base
                candidates = [(anchor / d.path_attr).resolve()]
            else:
                candidates = [base / f"{d.name}.rs", base / d.name / "mod.rs"]
            found = [c for c in candidates if c.is_file()]
            where = f"{rel(file, self.ws_root)}:{d.line}"
            if not found:
                self.warnings.append(f"{where}: `mod {d.name};` but none of {', '.join(rel(c, self.ws_root) for c in candidates)} exists")
                continue
            if len(found) > 1:
                self.warnings.append(f"{where}: `mod {d.name};` is ambiguous ({', '.join(rel(c, self.ws_root) for c in found)}); using the first")
            child = found[0]
            mod_rs = child.name == "mod.rs" or d.path_attr is not None
            self._load(child, modpath + d.scope + (d.name,), child.parent if mod_rs else child.parent / child.stem, test or d.test)

    def label(self) -> str:
        return f"{self.crate} ({self.kind} {rel(self.root_file, self.ws_root)})"

    # Scopes: what a module binds with `use`, and what it defines.
    def _scope_uses(self, m: ModPath, module_level_only: bool) -> list[UseLeaf]:
        mod = self.modules[m]
        pf = self.parse(mod.file)
        return [u for u in pf.uses if u.scope == mod.scope and (u.module_level or not module_level_only)]

    def _defines(self, m: ModPath, name: str) -> bool:
        mod = self.modules[m]
        return name in self.parse(mod.file).defs.get(mod.scope, set())

    def _binding(self, m: ModPath, name: str, module_level_only: bool) -> UseLeaf | None:
        for u in self._scope_uses(m, module_level_only):
            if not u.glob and u.bind == name:
                return u
        return None

    def absolutize(self, m: ModPath, segs: tuple[str, ...], depth: int = 0) -> ModPath | None:
        """A path written in module m, as a path from the crate root; None when it leaves the crate."""
        if not segs or depth > 20 or segs[0] == "::":
            return None
        first = segs[0]
        if first == "crate":
            return tuple(segs[1:])
        if first in ("self", "super"):
            base, k = m, 0
            while k < len(segs) and segs[k] in ("self", "super"):
                if segs[k] == "super":
                    if not base:
                        return None
                    base = base[:-1]
                k += 1
            return base + tuple(segs[k:])
        if first in self._children.get(m, ()):
            return m + tuple(segs)
        key = (m, first)
        if key not in self._alias_memo:
            self._alias_memo[key] = None  # guards `use a as b; use b as a;`
            leaf = self._binding(m, first, module_level_only=False)
            self._alias_memo[key] = self.absolutize(m, leaf.segs, depth + 1) if leaf else None
        base = self._alias_memo[key]
        return None if base is None else base + tuple(segs[1:])

    def locate(self, path: ModPath, seen: frozenset = frozenset()) -> ModPath:
        """The module that holds what `path` (from the crate root) names."""
        k = len(path)
        while k > 0 and path[:k] not in self.modules:
            k -= 1
        m, rest = path[:k], path[k:]
        if not rest or not self.follow or self._defines(m, rest[0]) or (m, rest[0]) in seen:
            return m
        seen = seen | {(m, rest[0])}
        leaf = self._binding(m, rest[0], module_level_only=True)
        if leaf is not None:
            target = self.absolutize(m, leaf.segs)
            return m if target is None else self.locate(target + rest[1:], seen)
        for g in self._scope_uses(m, module_level_only=True):
            if g.glob:
                gm = self.absolutize(m, g.segs)
                if gm in self.modules and (self._defines(gm, rest[0]) or self._binding(gm, rest[0], True)):
                    return self.locate(gm + rest, seen)
        return m

    def edges(self) -> tuple[list[Edge], int]:
        """Import edges between files outside tests, and how many were skipped as test-only."""
        out: list[Edge] = []
        skipped = 0
        for file, modpath in self.file_mod.items():
            pf = self.parse(file)
            items = [(u.segs, u.scope, u.line, u.test, u.glob) for u in pf.uses] + [
                (r.segs, r.scope, r.line, r.test, False) for r in pf.refs
            ]
            for segs, sc, line, test, is_glob in items:
                m = modpath + sc
                if m not in self.modules:
                    continue
                target = self.absolutize(m, segs)
                if target is None:
                    continue
                dst = self.modules[self.locate(target)].file
                if dst == file:
                    continue
                if test or self.file_test[file] or self.modules[m].test:
                    skipped += 1
                    continue
                out.append(Edge(file, dst, line, "::".join(segs) + ("::*" if is_glob else "")))
        return out, skipped


def crate_targets(crate: Crate) -> list[tuple[str, Path]]:
    src = crate.dir / "src"
    roots: list[tuple[str, Path]] = []
    lib = (crate.manifest.get("lib") or {}).get("path")
    lib_path = (crate.dir / lib) if lib else src / "lib.rs"
    if lib_path.is_file():
        roots.append(("lib", lib_path.resolve()))
    bins = [crate.dir / b["path"] for b in crate.manifest.get("bin", []) if isinstance(b, dict) and "path" in b]
    if (src / "main.rs").is_file():
        bins.append(src / "main.rs")
    if (src / "bin").is_dir():
        bins += sorted((src / "bin").glob("*.rs")) + sorted((src / "bin").glob("*/main.rs"))
    for b in bins:
        b = b.resolve()
        if b.is_file() and all(b != r for _, r in roots):
            roots.append(("bin", b))
    return roots


# ---------------------------------------------------------------------------------------------
# Graph algorithms
# ---------------------------------------------------------------------------------------------


def strongly_connected(graph: dict) -> list[list]:
    """Tarjan's algorithm (iterative); only groups of two or more nodes, each sorted."""
    index: dict = {}
    low: dict = {}
    on: set = set()
    stack: list = []
    groups: list[list] = []
    counter = 0
    nodes = sorted(set(graph) | {b for bs in graph.values() for b in bs}, key=str)
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()), key=str)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ()), key=str))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    groups.append(sorted(group, key=str))
    return sorted(groups, key=lambda g: [str(x) for x in g])


def simple_cycles(group: list, graph: dict, limit: int) -> tuple[list[list], bool]:
    """Elementary cycles inside one strongly connected group, each from its smallest node, shortest first."""
    members = set(group)
    order = {v: i for i, v in enumerate(group)}
    cycles: list[list] = []
    steps = 0
    for s in group:
        path, on = [s], {s}
        work = [iter(sorted((w for w in graph.get(s, ()) if w in members), key=str))]
        while work:
            steps += 1
            if steps > 2_000_000:
                return sorted(cycles, key=lambda c: (len(c), [str(x) for x in c])), True
            w = next(work[-1], None)
            if w is None:
                work.pop()
                on.discard(path.pop())
                continue
            if w == s:
                cycles.append(list(path))
                if len(cycles) >= limit:
                    return sorted(cycles, key=lambda c: (len(c), [str(x) for x in c])), True
            elif order[w] > order[s] and w not in on:
                path.append(w)
                on.add(w)
                work.append(iter(sorted((x for x in graph.get(w, ()) if x in members), key=str)))
    return sorted(cycles, key=lambda c: (len(c), [str(x) for x in c])), False


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def rel(p: Path, root: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(root))
    except ValueError:
        return str(p)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description="Check lake's crate layer order and file-level import cycles (see the module docstring).",
    )
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="workspace root (default: this script's repository)")
    ap.add_argument("--dot", action="store_true", help="print the crate dependency graph in Graphviz dot format instead of the report (exit 0)")
    ap.add_argument("--edges", action="store_true", help="also list every file-level import edge (outside tests)")
    ap.add_argument(
        "--no-follow-reexports",
        dest="follow",
        action="store_false",
        help="attribute `crate::Name` to the module that re-exports Name instead of the one defining it",
    )
    args = ap.parse_args(argv)
    root: Path = args.root.resolve()
    if not (root / "Cargo.toml").is_file():
        print(f"check-layering: no Cargo.toml in {root}", file=sys.stderr)
        return 2

    problems: list[str] = []  # could not read something: errors
    warnings: list[str] = []
    crates, graph = load_crates(root, problems, warnings)
    crate_errors, bad_edges = check_crates(crates, graph, root)

    if args.dot:
        print(crate_dot(crates, graph, bad_edges))
        for w in problems:
            print(f"check-layering: {w}", file=sys.stderr)
        return 0

    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    print(f"check-layering: {root} at {now}")
    print()

    # Crate level.
    rank = {n: i for i, n in enumerate(LAYERS)}
    present = sorted(crates.values(), key=lambda c: (rank.get(c.short, 99), c.name))
    n_dep_edges = sum(len(v) for v in graph.values())
    print("== Crate layers (a crate may depend only on crates above it in this list)")
    for c in present:
        deps = ", ".join(sorted(graph.get(c.name, ()), key=lambda d: (rank.get(short_name(d), 99), d))) or "-"
        layer = rank.get(c.short)
        print(f"  {('?' if layer is None else str(layer)):>2} {c.name:<14} -> {deps}")
    absent = [l for l in LAYERS if l not in {c.short for c in present}]
    if absent:
        print(f"  (not in the workspace, skipped: {', '.join(absent)})")
    if crate_errors:
        print(f"  FAIL: {len(crate_errors)} crate-level violation(s):")
        for e in crate_errors:
            print(f"    - {e}")
    else:
        print(f"  OK: {len(present)} crates, {n_dep_edges} workspace dependency edges, no cycle, layer order respected")
    print()

    # File level.
    parsed: dict[Path, ParsedFile | None] = {}

    def parse(path: Path) -> ParsedFile | None:
        if path not in parsed:
            try:
                parsed[path] = parse_rust(path, path.read_text(encoding="utf-8", errors="replace"))
            except OSError as e:
                problems.append(f"cannot read {rel(path, root)}: {e}")
                parsed[path] = None
        return parsed[path]

    print("== File-level import cycles (imports inside #[cfg(test)] / mod tests are ignored)")
    files_checked: set[Path] = set()
    test_files: set[Path] = set()
    seen_groups: dict[frozenset, list[str]] = {}
    n_groups = n_cycles = 0
    all_edges: list[tuple[str, Edge]] = []
    skipped_test_edges = 0
    orphans: list[Path] = []
    for c in present + sorted((c for c in crates.values() if c not in present), key=lambda c: c.name):
        targets = [Target(c.name, kind, f, parse, warnings, root, args.follow) for kind, f in crate_targets(c)]
        reached: set[Path] = set()
        for t in targets:
            reached |= set(t.file_mod)
            test_files |= {f for f, is_test in t.file_test.items() if is_test}
        files_checked |= reached
        src = c.dir / "src"
        if src.is_dir():
            orphans += sorted(p.resolve() for p in src.rglob("*.rs") if p.resolve() not in reached)
        crate_groups = []
        for t in targets:
            edges, skipped = t.edges()
            skipped_test_edges += skipped
            all_edges += [(t.label(), e) for e in edges]
            g: dict[Path, set[Path]] = {}
            for e in edges:
                g.setdefault(e.src, set()).add(e.dst)
            for group in strongly_connected(g):
                key = frozenset(group)
                if key in seen_groups:
                    seen_groups[key].append(t.label())
                    continue
                seen_groups[key] = [t.label()]
                crate_groups.append((t, group, g, edges))
        if not crate_groups:
            print(f"  {c.name}: OK ({len(reached)} files, {len(targets)} crate root{'s' if len(targets) != 1 else ''})")
            continue
        print(f"  {c.name}: {len(crate_groups)} cyclic group(s) ({len(reached)} files)")
        for t, group, g, edges in crate_groups:
            n_groups += 1
            cycles, truncated = simple_cycles(group, g, MAX_CYCLES_PER_GROUP)
            n_cycles += len(cycles)
            names = [rel(f, root) for f in group]
            print(f"    group {n_groups} in {t.label()}: {len(group)} files, {len(cycles)}{'+' if truncated else ''} simple cycle(s)")
            print(f"      files: {', '.join(names)}")
            print("      cycles (each a list of files, the first file repeated at the end):")
            for cyc in cycles:
                print("        - " + " -> ".join(rel(f, root) for f in cyc + [cyc[0]]))
            if truncated:
                print(f"        … stopped after {len(cycles)} cycles")
            print("      imports inside the group (first occurrence, and how many):")
            inside: dict[tuple[Path, Path], list[Edge]] = {}
            members = set(group)
            for e in edges:
                if e.src in members and e.dst in members:
                    inside.setdefault((e.src, e.dst), []).append(e)
            for (a, b), es in sorted(inside.items(), key=lambda kv: (rel(kv[0][0], root), rel(kv[0][1], root))):
                more = f" (+{len(es) - 1} more)" if len(es) > 1 else ""
                print(f"        {rel(a, root)}:{es[0].line} -> {rel(b, root)}   `{es[0].text}`{more}")
    for key, labels in seen_groups.items():
        if len(labels) > 1:
            print(f"  (the group {', '.join(sorted(rel(f, root) for f in key))} is in {', '.join(labels)}: reported once)")
    if orphans:
        print(f"  not reached from any crate root by `mod` declarations, skipped ({len(orphans)}):")
        for o in orphans:
            print(f"    - {rel(o, root)}")
    print()

    if args.edges:
        print("== File-level import edges (outside tests)")
        seen_e: set[tuple[Path, Path]] = set()
        for label, e in all_edges:
            if (e.src, e.dst) not in seen_e:
                seen_e.add((e.src, e.dst))
                print(f"  {rel(e.src, root)}:{e.line} -> {rel(e.dst, root)}   `{e.text}`")
        print()

    if warnings:
        print("== Warnings")
        for w in dict.fromkeys(warnings):
            print(f"  - {w}")
        print()
    if problems:
        print("== Errors reading the tree")
        for p in problems:
            print(f"  - {p}")
        print()

    failed = bool(crate_errors or n_groups or problems)
    print("== Summary")
    print(f"  crates checked: {len(present)} ({', '.join(c.short for c in present)})")
    print(
        f"  files checked: {len(files_checked)} module files ({len(test_files)} test-only; {skipped_test_edges} cross-file imports inside tests ignored)"
        + (f"; {len(orphans)} .rs files under src/ not in any module tree" if orphans else "")
    )
    print(f"  crate-level violations: {len(crate_errors)}")
    print(f"  file-level cycles: {n_groups} cyclic group(s), {n_cycles} simple cycle(s)")
    print(f"  result: {'FAIL' if failed else 'OK'}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # `... | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
