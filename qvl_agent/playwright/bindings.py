"""Where every name of a script is bound and read: the syntax-tree facts the script policy (`policy.py`)
judges names by. It never imports or runs the script."""

from __future__ import annotations

import ast


class Bindings:
    """Where every name of the script is bound and read, scope-blind on purpose: a name bound twice anywhere
    is never trusted, so no rebinding in a function or loop can change what a trusted name holds."""

    def __init__(self, tree: ast.AST) -> None:
        self.parents: dict[ast.AST, ast.AST] = {}
        self.bound: dict[str, list[ast.AST]] = {}  # name -> the Assign that binds it, or another binder
        self.loads: dict[str, list[ast.Name]] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # local name -> (module, member or None)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    self.loads.setdefault(node.id, []).append(node)
                else:
                    parent = self.parents.get(node)
                    simple = isinstance(parent, ast.Assign) and parent.targets == [node]
                    self._bind(node.id, parent if simple else node)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    self._bind(name, node)
                    if isinstance(node, ast.Import):
                        self.imports[name] = (alias.name, None)
                    else:
                        self.imports[name] = (node.module or "", alias.name)
            elif isinstance(node, ast.arg):
                self._bind(node.arg, node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self._bind(node.name, node)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                for name in node.names:
                    self._bind(name, node)
            elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
                self._bind(node.name, node)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                self._bind(node.rest, node)

    def _bind(self, name: str, node: ast.AST) -> None:
        self.bound.setdefault(name, []).append(node)

    def value(self, name: str) -> ast.expr | None:
        """What `name` holds when the script binds it once, by a plain `name = value`; else None."""
        binders = self.bound.get(name, [])
        if len(binders) == 1 and isinstance(binders[0], ast.Assign):
            return binders[0].value
        return None

    def module_of(self, node: ast.expr) -> tuple[str, str | None] | None:
        """(module, member) when `node` is a name bound once, by an import."""
        if isinstance(node, ast.Name) and len(self.bound.get(node.id, [])) == 1:
            return self.imports.get(node.id)
        return None

    def is_member(self, node: ast.expr, module: str, member: str) -> bool:
        """Whether `node` is `module.member` (through `import module [as m]` or `from module import member`)."""
        if isinstance(node, ast.Attribute) and node.attr == member:
            return self.module_of(node.value) == (module, None)
        return self.module_of(node) == (module, member)

    def only_attribute_loads(self, name: str) -> bool:
        """Whether `name` is only ever read as `name.attribute`: never passed on, aliased or written through."""
        for load in self.loads.get(name, []):
            parent = self.parents.get(load)
            if not (isinstance(parent, ast.Attribute) and isinstance(parent.ctx, ast.Load)):
                return False
        return True
