"""Every global name that hexcore's code reads is bound in its module.

Paths that only run on a GPU or with torch (``prefill``'s SDPA path, the transformers
integration) never run in CI, so a deleted helper there would otherwise surface first on
the device. This reads the source alone (nothing is imported): each function's global
loads (``dis``) against the names the module binds at top level, in any branch (names
defined only off the simulator count), and the builtins.
"""

import ast
import builtins
import dis
import pathlib
import types

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hexcore"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _top_level_bindings(tree: ast.Module) -> set[str]:
    """Names bound by the module's statements, through if/try/with/for, not into
    function or class bodies."""
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            elif isinstance(child, ast.stmt) or isinstance(child, (ast.Tuple, ast.List, ast.excepthandler)):
                pending.append(child)
            elif isinstance(child, ast.withitem) and child.optional_vars is not None:
                pending.append(child.optional_vars)
    return names


def _global_loads(code: types.CodeType):
    """(function name, global name) for every LOAD_GLOBAL in ``code`` and nested code."""
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            yield code.co_name, ins.argval
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_loads(const)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_every_global_read_is_bound(path):
    source = path.read_text()
    bound = _top_level_bindings(ast.parse(source)) | set(dir(builtins)) | {"__file__", "__name__"}
    unbound = {(fn, name) for fn, name in _global_loads(compile(source, str(path), "exec")) if name not in bound}
    assert not unbound, f"{path.name}: names read but never bound (function, name): {sorted(unbound)}"


def test_the_check_finds_an_unbound_name():
    code = compile("import os\ndef f():\n    return os.sep + _gone()\n", "probe", "exec")
    bound = _top_level_bindings(ast.parse("import os\ndef f(): pass\n")) | set(dir(builtins))
    assert [name for _, name in _global_loads(code) if name not in bound] == ["_gone"]
