"""The library's defaults, read from its source, so that ``arl`` starts without importing torch.

An option of ``arl`` that sets something the library also has a default for defaults to the library's
value: a field of a config dataclass (``library("arl_models.online.config", "FinetuneConfig").utd``), a
keyword default of a stage function (``library("arl_models.offline", "train_bc").preset``) or a module
constant. Importing those modules imports torch, a second or two that ``arl --help`` must not wait for,
so :func:`library` reads the values from the source files instead. It evaluates what the library writes
its defaults as: literals, names bound at module level or imported from another module, calls of a
dataclass with such keywords, and attributes of those; anything else raises :class:`LookupError` naming
it. ``tests/test_cli_defaults.py`` checks every option that reads one against the imported library.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

_STATEMENT_START = re.compile(r"[A-Za-z_@]")
"""A line that starts a top-level statement; indented lines, closing brackets and blank lines continue one."""


def library(module: str, name: str) -> Any:
    """What ``module.name`` is once imported: a constant's value, or a class's or a function's defaults as
    :class:`Defaults`."""
    return _value(module, name)


class Defaults:
    """The defaults of a class (its annotated fields, a call's keywords over them) or of a function's keyword
    arguments, each read when it is asked for as an attribute."""

    def __init__(
        self,
        where: str,
        names: dict[str, tuple[str, ast.expr]],
        bases: tuple[tuple[str, ast.expr], ...] = (),
        is_class: bool = False,
    ) -> None:
        self._where = where
        self._names = names
        """Name -> (the module the expression is written in, the expression)."""
        self._base_classes = bases
        """(module, expression) of each base class, read when a name is not the class's own."""
        self._is_class = is_class

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._names:
            return _evaluate(*self._names[name])
        for base in self._bases():
            if name in base._all_names():
                return getattr(base, name)
        raise AttributeError(f"{self._where} has no default {name!r}")

    def _bases(self) -> list[Defaults]:
        return [_base(module, node) for module, node in self._base_classes]

    def _all_names(self) -> set[str]:
        return set(self._names).union(*(b._all_names() for b in self._bases()))

    def _called(self, module: str, keywords: list[ast.keyword]) -> Defaults:
        """The defaults of ``Class(**keywords)``, the keywords written in ``module``."""
        given = {kw.arg: (module, kw.value) for kw in keywords if kw.arg is not None}
        if not self._is_class or len(given) != len(keywords):
            raise LookupError(f"{module}: cannot read a call of {self._where} without importing it")
        return Defaults(self._where, {**self._names, **given}, self._base_classes, is_class=True)

    def __repr__(self) -> str:
        return f"Defaults({self._where})"


@cache
def _path(module: str) -> Path:
    """The source file of ``module``, found without importing it or its packages."""
    top, *rest = module.split(".")
    spec = find_spec(top)  # a top-level name: located, not imported
    if spec is None or spec.origin is None:
        raise LookupError(f"no module {top!r}")
    path = Path(spec.origin).parent.joinpath(*rest) if rest else Path(spec.origin)
    if rest:
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return path


@cache
def _statements(module: str) -> tuple[str, ...]:
    """``module``'s source cut into top-level statements (a decorator apart from what it decorates)."""
    lines = _path(module).read_text().splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if _STATEMENT_START.match(line)]
    return tuple("".join(lines[a:b]) for a, b in zip(starts, [*starts[1:], len(lines)], strict=True))


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_path(module).read_text())


def _binds(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return stmt.name == name
    if isinstance(stmt, ast.ImportFrom):
        return any((a.asname or a.name) == name for a in stmt.names)
    if isinstance(stmt, ast.AnnAssign):
        return stmt.value is not None and isinstance(stmt.target, ast.Name) and stmt.target.id == name
    if isinstance(stmt, ast.Assign):
        return any(_target_index(t, name) is not None for t in stmt.targets)
    return False


def _target_index(target: ast.expr, name: str) -> int | None:
    """-1 where ``target`` is ``name``, ``i`` where it is a tuple whose item ``i`` is, else None."""
    if isinstance(target, ast.Name):
        return -1 if target.id == name else None
    if isinstance(target, ast.Tuple):
        ids = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
        return ids.index(name) if name in ids else None
    return None


@cache
def _definition(module: str, name: str) -> ast.stmt:
    """The last top-level statement of ``module`` that binds ``name``, parsed alone where it can be (parsing
    a whole module costs more than the rest of ``arl``'s start)."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    for text in reversed(_statements(module)):
        if not word.search(text.split("\n", 1)[0] if not text.startswith("from ") else text):
            continue
        try:
            parsed = ast.parse(text).body
        except SyntaxError:  # a statement the line cut does not find (try/else, a string at column 0)
            break
        if parsed and _binds(parsed[0], name):
            return parsed[0]
    for stmt in reversed(_tree(module).body):
        if _binds(stmt, name):
            return stmt
    raise LookupError(f"{module} binds no {name!r} at module level")


def _source_module(module: str, stmt: ast.ImportFrom) -> str:
    if not stmt.level:
        return stmt.module or ""
    package = module.split(".")
    if _path(module).name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - stmt.level + 1]
    return ".".join([*package, *([stmt.module] if stmt.module else [])])


def _value(module: str, name: str) -> Any:
    stmt = _definition(module, name)
    where = f"{module}.{name}"
    if isinstance(stmt, ast.ClassDef):
        names = {
            s.target.id: (module, s.value)
            for s in stmt.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None
        }
        return Defaults(where, names, tuple((module, b) for b in stmt.bases), is_class=True)
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        a = stmt.args
        positional = [*a.posonlyargs, *a.args]
        names = {
            arg.arg: (module, d)
            for arg, d in zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)
        }
        names |= {
            arg.arg: (module, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None
        }
        return Defaults(where, names)
    if isinstance(stmt, ast.ImportFrom):
        alias = next(a for a in stmt.names if (a.asname or a.name) == name)
        return _value(_source_module(module, stmt), alias.name)
    if isinstance(stmt, ast.Assign):
        i = next(i for t in stmt.targets if (i := _target_index(t, name)) is not None)
        if i >= 0:  # a, b = x, y
            if not isinstance(stmt.value, ast.Tuple):
                raise LookupError(f"{where}: cannot read an unpacked {ast.unparse(stmt.value)!r}")
            return _evaluate(module, stmt.value.elts[i])
    assert isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None
    return _evaluate(module, stmt.value)


def _base(module: str, node: ast.expr) -> Defaults:
    """A base class's defaults; bases the library's source does not define (``object``, ``Protocol``) have
    none."""
    try:
        base = _evaluate(module, node)
    except LookupError:
        return Defaults(f"{module}: {ast.unparse(node)}", {})
    return base if isinstance(base, Defaults) else Defaults(f"{module}: {ast.unparse(node)}", {})


def _evaluate(module: str, node: ast.expr) -> Any:
    """The value of the expression ``node`` written in ``module``."""
    if isinstance(node, ast.Name):
        return _value(module, node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_evaluate(module, node.value), node.attr)
    if isinstance(node, ast.Call) and not node.args:
        called = _evaluate(module, node.func)
        if isinstance(called, Defaults):
            return called._called(module, node.keywords)
    if isinstance(node, ast.Tuple | ast.List):
        items = [_evaluate(module, e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise LookupError(f"{module}: cannot read {ast.unparse(node)!r} without importing it") from None
