"""What ``lumos migrate`` will change in one source, decided before anything changes.

:class:`Planner` walks a libcst tree (through a ``MetadataWrapper``: qualified names
say what each ``tune`` or ``ray.tune.x`` refers to) and records each replacement by
the node it replaces, with the warnings, the rewrite count and the ``import lumos.x``
lines that attribute uses of ``ray.*`` now need. ``migrate.py`` applies the plan.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider, QualifiedNameProvider, QualifiedNameSource

from lumos.storage._internal.migrate_resolve import Mapped, Missing, Resolution, resolve


def dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a chain of names, None for anything else (a call, a subscript)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _root(node: cst.BaseExpression) -> cst.Name | None:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def expr(name: str) -> cst.Name | cst.Attribute:
    """The expression (or import path) ``a.b.c``."""
    first, *rest = name.split(".")
    node: cst.Name | cst.Attribute = cst.Name(first)
    for part in rest:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _no_trailing_comma(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    return [*aliases[:-1], aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]


def _closing_line(node: cst.ImportFrom) -> cst.ParenthesizedWhitespace | None:
    """The line break before the original's ``)`` (after its last name's comma, or
    before the parenthesis), None when ``)`` is on the last name's line."""
    names = node.names
    assert not isinstance(names, cst.ImportStar)
    comma = names[-1].comma
    if isinstance(comma, cst.Comma) and isinstance(
        comma.whitespace_after, cst.ParenthesizedWhitespace
    ):
        return comma.whitespace_after
    before = node.rpar.whitespace_before if node.rpar is not None else None
    return before if isinstance(before, cst.ParenthesizedWhitespace) else None


def _closed(
    node: cst.ImportFrom, aliases: list[cst.ImportAlias]
) -> tuple[list[cst.ImportAlias], cst.RightParen | None]:
    """A new import's names and ``)``: its last name keeps its own comment and line
    break, and ``)`` goes where the original's was."""
    if node.rpar is None:
        return _no_trailing_comma(aliases), None
    last = aliases[-1]
    own = last.comma
    closing = _closing_line(node)
    if (
        isinstance(own, cst.Comma)
        and isinstance(own.whitespace_after, cst.ParenthesizedWhitespace)
        and (closing is not None or own.whitespace_after.first_line.comment is not None)
    ):
        after = own.whitespace_after.with_changes(
            indent=closing.indent if closing else True,
            last_line=closing.last_line if closing else cst.SimpleWhitespace(""),
        )
        last = last.with_changes(comma=own.with_changes(whitespace_after=after))
        return [*aliases[:-1], last], cst.RightParen()
    assert not isinstance(node.names, cst.ImportStar)
    return [*aliases[:-1], last.with_changes(comma=node.names[-1].comma)], node.rpar


def binds_ray(stmt: cst.BaseSmallStatement) -> bool:
    """``import ray`` / ``import ray.x`` / ``import ray as r``: the statement binds Ray."""
    if not isinstance(stmt, cst.Import):
        return False
    names = [dotted(a.name) or "" for a in stmt.names]
    return any(n == "ray" or n.startswith("ray.") for n in names)


def _is_tune(name: str | None) -> bool:
    return name is not None and (name == "ray.tune" or name.startswith("ray.tune."))


def satisfied(module: str, present: set[str]) -> bool:
    """``import lumos.tune.x`` makes ``lumos.tune`` usable too."""
    return any(p == module or p.startswith(module + ".") for p in present)


def _reason(found: tuple[Resolution, str]) -> str:
    res, rest = found
    if isinstance(res, Missing):
        return res.reason
    return f"lumos has it as {res.target}{rest}, which cannot be imported this way"


class TuneUse(cst.CSTVisitor):
    """Whether a source uses Ray Tune (which side an ambiguous ``ray.air`` name takes)."""

    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def visit_Import(self, node: cst.Import) -> None:
        self.found |= any(_is_tune(dotted(a.name)) for a in node.names)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = dotted(node.module) if node.module is not None and not node.relative else None
        if _is_tune(module):
            self.found = True
        elif module == "ray" and not isinstance(node.names, cst.ImportStar):
            self.found |= any(dotted(a.name) == "tune" for a in node.names)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.found |= _is_tune(dotted(node))


class Planner(cst.CSTVisitor):
    """Plans one module's rewrite (visit it through a ``libcst.MetadataWrapper``).

    Attributes:
        statements: An import node -> the statements replacing it.
        expressions: A ``Name`` / ``Attribute`` node -> the expression replacing it.
        warnings: ``(line, message)`` pairs, each once.
        rewrites: Imported names and uses rewritten.
        needed: lumos modules that rewritten ``ray.x.y`` uses need imported.
        present: lumos modules an ``import lumos.x`` binds (after the rewrite).
        ray_used: Code still uses the name ``ray`` (``ray.init``, a name lumos lacks).
        ray_bound: An import that stays binds the name ``ray``.
        unbinds_ray: The first rewritten import that no longer binds ``ray``.
        anchor: The statement line after which the ``needed`` imports go.
    """

    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, uses_tune: bool) -> None:
        super().__init__()
        self.uses_tune = uses_tune
        self.statements: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = {}
        self.expressions: dict[cst.CSTNode, cst.BaseExpression] = {}
        self.warnings: set[tuple[int, str]] = set()
        self.rewrites = 0
        self.needed: set[str] = set()
        self.present: set[str] = set()
        self.ray_used = False
        self.ray_bound = False
        self.unbinds_ray: cst.Import | None = None
        self.anchor: cst.SimpleStatementLine | None = None

    # -- bookkeeping ----------------------------------------------------------------------

    def _warn(self, node: cst.CSTNode, message: str) -> None:
        self.warnings.add((self.get_metadata(PositionProvider, node).start.line, message))

    def _note(self, node: cst.CSTNode, res: Mapped) -> None:
        if res.note:
            self._warn(node, res.note)

    def _qualified(self, node: cst.CSTNode) -> str | None:
        """The one imported name ``node`` refers to (None: a local, or several)."""
        names = self.get_metadata(QualifiedNameProvider, node, set())
        if len(names) != 1:
            return None
        (name,) = names
        return name.name if name.source is QualifiedNameSource.IMPORT else None

    def visit_Module(self, node: cst.Module) -> None:
        for stmt in node.body:
            if isinstance(stmt, cst.SimpleStatementLine) and any(map(binds_ray, stmt.body)):
                self.anchor = stmt
                return

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self.anchor is None and any(map(binds_ray, node.body)):
            self.anchor = node  # no module-level `import ray`: the first one anywhere

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.needed and self.anchor is None:
            imports = ", ".join(sorted(self.needed))
            self.warnings.add((1, f"add `import {imports}`: no `import ray` to put it after"))

    # -- imports --------------------------------------------------------------------------

    def _kept_binding(self, alias: cst.ImportAlias, name: str) -> None:
        if alias.asname is None and (name == "ray" or name.startswith("ray.")):
            self.ray_bound = True
        elif alias.asname is None and name.startswith("lumos."):
            self.present.add(name)

    def visit_Import(self, node: cst.Import) -> bool:
        aliases: list[cst.ImportAlias] = []
        changed, unbinds = 0, False
        for alias in node.names:
            name = dotted(alias.name) or ""
            found = resolve(name, self.uses_tune)
            res = found[0] if found else None
            if found is None or not isinstance(res, Mapped) or not res.is_module or found[1]:
                if found is not None:
                    self._warn(node, f"{name}: {_reason(found)}")
                self._kept_binding(alias, name)
                aliases.append(alias)
                continue
            aliases.append(alias.with_changes(name=expr(res.target)))
            changed += 1
            if alias.asname is None:
                unbinds = True
                self.present.add(res.target)
        if changed:
            self.rewrites += changed
            names = _no_trailing_comma(aliases)
            self.statements[node] = [node.with_changes(names=names)]
            if unbinds and self.unbinds_ray is None:
                self.unbinds_ray = node
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None:
            return False
        module = dotted(node.module) or ""
        if isinstance(node.names, cst.ImportStar):
            self._star(node, module)
            return False
        groups: dict[str | None, list[cst.ImportAlias]] = {}  # None: stays in `module`
        moved = 0
        for alias in node.names:
            target_module, new_alias = self._from_alias(node, module, alias)
            groups.setdefault(target_module, []).append(new_alias)
            moved += target_module is not None
        if moved:
            self.rewrites += moved
            self.statements[node] = _from_statements(node, groups)
        return False

    def _from_alias(
        self, node: cst.ImportFrom, module: str, alias: cst.ImportAlias
    ) -> tuple[str | None, cst.ImportAlias]:
        """``(lumos module, alias)`` for one imported name; ``(None, alias)`` keeps it Ray's."""
        name = dotted(alias.name) or ""
        found = resolve(f"{module}.{name}", self.uses_tune)
        if found is None:
            return None, alias
        res, rest = found
        if not isinstance(res, Mapped) or rest:
            self._warn(node, f"{module}.{name}: {_reason(found)}")
            return None, alias
        self._note(node, res)
        parent, _, last = res.target.rpartition(".")
        asname = alias.asname
        if asname is not None and dotted(asname.name) == name and not res.is_module:
            asname = None  # `X as X` of a renamed name: the uses are renamed
        if asname is None and res.is_module and last != name:
            asname = cst.AsName(name=cst.Name(name))  # a module keeps its local name
        return parent, alias.with_changes(name=cst.Name(last), asname=asname)

    def _star(self, node: cst.ImportFrom, module: str) -> None:
        found = resolve(module, self.uses_tune)
        if found is None:
            return
        res, rest = found
        if not isinstance(res, Mapped) or not res.is_module or rest:
            self._warn(node, f"from {module} import *: {_reason(found)}")
            return
        self.statements[node] = [node.with_changes(module=expr(res.target))]
        self.rewrites += 1
        self._warn(
            node, f"from {res.target} import *: check that lumos has every name the file uses"
        )

    # -- uses -----------------------------------------------------------------------------

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return self._use(node)

    def visit_Name(self, node: cst.Name) -> bool:
        return self._use(node)

    def _use(self, node: cst.Name | cst.Attribute) -> bool:
        """Plan a use of an imported Ray name; False: its parts are planned with it."""
        name = self._qualified(node)
        if name == "ray" and isinstance(node, cst.Name):
            self.ray_used = True
        root, text = _root(node), dotted(node)
        found = resolve(name, self.uses_tune) if name else None
        if found is None or root is None or text is None:
            return True
        bound_to = self._qualified(root)
        if bound_to == "ray":
            self._use_through_ray(node, text, found)
        elif bound_to is not None:
            self._use_through_import(node, root, bound_to, text, found)
        return False

    def _use_through_ray(
        self, node: cst.Name | cst.Attribute, text: str, found: tuple[Resolution, str]
    ) -> None:
        """``ray.tune.report`` after ``import ray`` -> ``lumos.tune.report``."""
        res, rest = found
        if not isinstance(res, Mapped):
            self.ray_used = True
            self._warn(node, f"{text}: {_reason(found)}")
            return
        self._note(node, res)
        self.expressions[node] = _replace(node, res.target + rest)
        self.needed.add(res.module)
        self.rewrites += 1

    def _use_through_import(
        self,
        node: cst.Name | cst.Attribute,
        root: cst.Name,
        bound_to: str,
        text: str,
        found: tuple[Resolution, str],
    ) -> None:
        """``tune.x`` after ``from ray import tune``: the import is rewritten; rename or warn."""
        bound = resolve(bound_to, self.uses_tune)
        if bound is None or not isinstance(bound[0], Mapped) or bound[1]:
            return  # the import stays Ray's (and was warned about)
        base, (res, rest) = bound[0], found
        if not isinstance(res, Mapped):
            self._warn(node, f"{text}: {_reason(found)}")
            return
        full = res.target + rest
        if full != base.target and not full.startswith(base.target + "."):
            self._warn(node, f"{text}: lumos has it as {full}; import it from there")
            return
        keeps_name = base.is_module or root.value != bound_to.rpartition(".")[2]
        local = root.value if keeps_name else base.target.rpartition(".")[2]
        new_text = local + full[len(base.target) :]
        if new_text != text:
            self.expressions[node] = _replace(node, new_text)
            self.rewrites += 1


def _replace(node: cst.Name | cst.Attribute, name: str) -> cst.BaseExpression:
    """The expression ``name`` in ``node``'s parentheses."""
    return expr(name).with_changes(lpar=node.lpar, rpar=node.rpar)


def _open(node: cst.ImportFrom) -> cst.LeftParen | None:
    """The original's ``(`` for another import, without the comment after it."""
    lpar = node.lpar
    if lpar is None or not isinstance(lpar.whitespace_after, cst.ParenthesizedWhitespace):
        return lpar
    return lpar.with_changes(
        whitespace_after=lpar.whitespace_after.with_changes(first_line=cst.TrailingWhitespace())
    )


def _from_statements(
    node: cst.ImportFrom, groups: dict[str | None, list[cst.ImportAlias]]
) -> list[cst.BaseSmallStatement]:
    """One ``from M import ...`` per module (the first keeps the original's formatting)."""
    out: list[cst.ImportFrom] = []
    for module, aliases in groups.items():
        names, rpar = _closed(node, aliases)
        path = node.module if module is None else expr(module)
        if not out:
            out.append(node.with_changes(module=path, names=names, rpar=rpar))
        else:
            out.append(cst.ImportFrom(module=path, names=names, lpar=_open(node), rpar=rpar))
    ends = out[-1].with_changes(semicolon=node.semicolon)
    stmts: list[cst.BaseSmallStatement] = [
        s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in out[:-1]
    ]
    return [*stmts, ends]
