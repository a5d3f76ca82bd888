"""Names for temporaries from the statement that created them.

A tensor nobody named and nothing holds when a finding is made (a local of a function that
returned) is named by the source of its allocating frame: the assignment target and its function
(`prepare_draft_extend_layout: positions`), or the parameter it was passed as
(`try_small_copy(dst=...)`). The checker keeps, per storage, the first op's innermost frame (a
code object and bytecode offset, no source); everything here runs only for storages in a finding,
so the per-op path pays nothing. The same allocating statement gives the same name in every
iteration, whatever the tensor's size.
"""
from __future__ import annotations

import ast
import inspect
import linecache
import sys
import types

from racecheck.core.trace import frame_info

_trees: dict = {}       # filename -> (ast tree, parent map) or None
_names: dict = {}       # (filename, line, positions) -> name or None
# expressions whose value is (a view of) the tensor their operand made: `torch.empty(n).zero_()`,
# `torch.empty(n)[:k]`
_THROUGH = (ast.Attribute, ast.Subscript, ast.Starred)


def creation_name(frame) -> str | None:
    """What the program's statement at `frame` calls the value it creates, or None."""
    try:
        filename, line, func = frame_info(frame)
        pos = _positions(frame)
        key = (filename, line, pos)
        if key not in _names:
            _names[key] = _name(filename, line, func, pos)
        return _names[key]
    except Exception:       # naming is a courtesy: never let it break a report
        return None


def _positions(frame):
    """(line, end line, column, end column) of the instruction a raw frame points at."""
    if len(frame) != 2:
        return None
    code, lasti = frame
    try:
        for i, p in enumerate(code.co_positions()):
            if i == lasti // 2:
                return p if None not in p else None
    except AttributeError:      # Python < 3.11: lines only
        return None
    return None


def _tree(filename):
    if filename not in _trees:
        src = "".join(linecache.getlines(filename))
        try:
            tree = ast.parse(src) if src else None
        except (SyntaxError, ValueError):
            tree = None
        parents = {}
        if tree is not None:
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    parents[child] = node
        _trees[filename] = (tree, parents) if tree is not None else None
    return _trees[filename]


def _name(filename, line, func, pos):
    parsed = _tree(filename)
    if parsed is None:
        return None
    tree, parents = parsed
    node = _expression_at(tree, line, pos)
    if node is None:
        return None
    while True:
        up = parents.get(node)
        if isinstance(up, _THROUGH) and getattr(up, "value", None) is node:
            node = up
        elif isinstance(up, ast.Call) and up.func is node:      # a method called on it
            node = up
        elif isinstance(up, ast.NamedExpr):
            return f"{func}: {up.target.id}"
        elif isinstance(up, (ast.Tuple, ast.List)) and isinstance(parents.get(up), ast.Assign):
            assign = parents[up]
            target = assign.targets[0]
            if assign.value is up and isinstance(target, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(up.elts):
                return _target(func, target.elts[up.elts.index(node)])
            return None
        elif isinstance(up, (ast.Assign, ast.AnnAssign)):
            return _target(func, up.targets[0] if isinstance(up, ast.Assign) else up.target)
        elif isinstance(up, ast.keyword) and up.arg:
            return f"{_callee(parents.get(up))}({up.arg}=...)"
        elif isinstance(up, ast.Call) and node in up.args:
            index = up.args.index(node)
            if any(isinstance(a, ast.Starred) for a in up.args[:index + 1]):
                return None
            param = _parameter(filename, up, index)
            return f"{_callee(up)}({param}=...)" if param else None
        elif isinstance(up, ast.Return):
            return f"{func}: returned value"
        elif isinstance(up, ast.Expr):
            return _receiver(func, node)
        else:
            return None


def _receiver(func, node) -> str | None:
    """`out.copy_(src)` as a statement: the storage made just before it (an allocation no op
    showed, e.g. pinned host memory) is the one the in-place method writes, `out`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr.endswith("_") and not node.func.attr.startswith("_") \
            and isinstance(node.func.value, ast.Name):
        return f"{func}: {node.func.value.id}"
    return None


def _expression_at(tree, line, pos):
    """The expression the instruction at `pos` evaluates; without columns (a saved trace), the
    value of the one simple statement on `line`."""
    if pos is not None:
        best = None
        for node in ast.walk(tree):
            if isinstance(node, ast.expr) and getattr(node, "lineno", None) == pos[0] \
                    and (node.lineno, node.end_lineno, node.col_offset, node.end_col_offset) == pos:
                best = node
        return best
    stmts = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
             and n.lineno == line and n.end_lineno == line and n.value is not None]
    if len(stmts) != 1 or isinstance(stmts[0].value, (ast.Tuple, ast.List)):
        return None
    return stmts[0].value


def _target(func, target) -> str | None:
    if isinstance(target, ast.Name):
        return f"{func}: {target.id}"
    if isinstance(target, (ast.Attribute, ast.Subscript)):
        return f"{func}: {ast.unparse(target)}"
    return None


def _callee(call) -> str:
    f = call.func if isinstance(call, ast.Call) else None
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return "call"


def _parameter(filename, call, index) -> str | None:
    """The name of positional parameter `index` of the function `call` calls, found in the
    module that made the call (a plain function, or a method of one of its classes)."""
    module = next((m for m in list(sys.modules.values())
                   if getattr(m, "__file__", None) == filename), None)
    if module is None:
        return None
    f = call.func
    candidates = []
    if isinstance(f, ast.Name):
        candidates = [getattr(module, f.id, None)]
        skip = 0
    elif isinstance(f, ast.Attribute):
        base = getattr(module, f.value.id, None) if isinstance(f.value, ast.Name) else None
        if isinstance(base, types.ModuleType):
            candidates, skip = [getattr(base, f.attr, None)], 0
        else:                   # a method, called bound
            candidates = [v.__dict__.get(f.attr) for v in vars(module).values()
                          if isinstance(v, type) and v.__module__ == module.__name__]
            candidates, skip = [c for c in candidates if c is not None], 1
    names = set()
    for c in candidates:
        if isinstance(c, (staticmethod, classmethod)):
            skip = 0 if isinstance(c, staticmethod) else 1
            c = c.__func__
        if not callable(c):
            continue
        try:
            params = [p for p in inspect.signature(c).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            continue
        if index + skip < len(params):
            names.add(params[index + skip].name)
    return names.pop() if len(names) == 1 else None
