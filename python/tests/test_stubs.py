"""The type stubs (numesh/_numesh.pyi, written by hand) name every public function, class,
method and property of the C++ module, so editors and type checkers see all of it."""

import ast
import pathlib

import numesh
from numesh import _numesh

STUBS = pathlib.Path(numesh.__file__).with_name("_numesh.pyi")


def stubbed():
    tree = ast.parse(STUBS.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            names[node.name] = members
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
    return names


def test_every_public_name_of_the_module_is_stubbed():
    stubs = stubbed()
    # Private functions and tables (_canonical_entries, _MODES, ...) serve the package's own
    # Python files; the private classes (_PartitionManager, the sentinels' types) are stubbed.
    public = {n for n in dir(_numesh) if not n.startswith("__")
              and (not n.startswith("_") or isinstance(getattr(_numesh, n), type))}
    assert public - set(stubs) == set()
    for name in public:
        obj = getattr(_numesh, name)
        if not isinstance(obj, type) or issubclass(obj, BaseException):
            continue
        members = {m for m in vars(obj) if not m.startswith("_") or m in ("__enter__", "__exit__")}
        assert members - (stubs[name] or set()) == set(), name
