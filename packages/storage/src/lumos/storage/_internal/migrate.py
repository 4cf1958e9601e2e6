"""``lumos migrate`` on one source: Ray Train / Tune imports and uses become lumos's.

Built on libcst's concrete syntax tree, so comments, blank lines and formatting stay.
Two steps, deciding apart from doing: ``migrate_plan.Planner`` walks the tree (with
qualified names, so ``tune`` means ``ray.tune`` only where an import bound it) and
plans each replacement; :class:`_Rewriter` applies the plan.

- An import of Ray Train / Tune / AIR names is rewritten to lumos's modules, split in
  two where only some names have a lumos equivalent (the others stay Ray's, with a
  warning). A name lumos spells otherwise is renamed, its uses too.
- ``ray.tune.report(...)`` after ``import ray`` becomes ``lumos.tune.report(...)``,
  and ``import lumos.tune`` is added after that ``import ray``.
- ``import ray``, ``ray.init()``, ``ray.remote`` and the rest of Ray stay as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from lumos.storage._internal.migrate_plan import Planner, TuneUse, expr, satisfied


@dataclass(frozen=True)
class MigrationWarning:
    """A Ray name ``lumos migrate`` left as it is (or a choice to check).

    Attributes:
        line: The line in the source (1-based).
        message: The Ray name, why, and the way out.
    """

    line: int
    message: str


@dataclass(frozen=True)
class Migration:
    """One source after ``lumos migrate``.

    Attributes:
        code: The rewritten source (the same text when nothing changed).
        rewrites: How many imported names and uses were rewritten.
        warnings: What was left alone or needs a look, by line.
        changed: ``code`` differs from the source.
    """

    code: str
    rewrites: int
    warnings: tuple[MigrationWarning, ...]
    changed: bool


def migrate_source(source: str) -> Migration:
    """Rewrite one Python source's Ray Train / Tune imports and uses to lumos.

    Args:
        source: The text of a Python module.

    Returns:
        The rewritten code, the number of rewrites and the warnings.

    Raises:
        libcst.ParserSyntaxError: ``source`` is not valid Python.

    Example:
        >>> migrate_source("from ray import tune\\n").code
        'from lumos import tune\\n'
    """
    wrapper = cst.MetadataWrapper(cst.parse_module(source))
    scan = TuneUse()
    wrapper.module.visit(scan)
    plan = Planner(uses_tune=scan.found)
    wrapper.visit(plan)
    code = wrapper.module.visit(_Rewriter(plan)).code
    warnings = tuple(MigrationWarning(line, msg) for line, msg in sorted(plan.warnings))
    return Migration(code, plan.rewrites, warnings, code != source)


def _import_line(module: str) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(body=[cst.Import(names=[cst.ImportAlias(name=expr(module))])])


class _Rewriter(cst.CSTTransformer):
    """Applies a :class:`Planner`'s plan to the tree it planned (nodes by identity)."""

    def __init__(self, plan: Planner) -> None:
        super().__init__()
        self.plan = plan
        # `import ray.tune` became `import lumos.tune`: keep `ray` bound where code uses it
        self.rebind = plan.unbinds_ray if plan.ray_used and not plan.ray_bound else None
        self.added = sorted(m for m in plan.needed if not satisfied(m, plan.present))

    def _statements(
        self, original: cst.Import | cst.ImportFrom, updated: cst.BaseSmallStatement
    ) -> cst.BaseSmallStatement | cst.FlattenSentinel[cst.BaseSmallStatement]:
        planned = self.plan.statements.get(original)
        if planned is None:
            return updated
        if original is self.rebind:
            planned = [cst.Import(names=[cst.ImportAlias(name=cst.Name("ray"))]), *planned]
        return planned[0] if len(planned) == 1 else cst.FlattenSentinel(planned)

    def leave_Import(
        self, original_node: cst.Import, updated_node: cst.Import
    ) -> cst.BaseSmallStatement | cst.FlattenSentinel[cst.BaseSmallStatement]:
        return self._statements(original_node, updated_node)

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.BaseSmallStatement | cst.FlattenSentinel[cst.BaseSmallStatement]:
        return self._statements(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.plan.expressions.get(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self.plan.expressions.get(original_node, updated_node)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        lines = [updated_node]
        if len(original_node.body) == 1 and len(updated_node.body) > 1:
            lines = _split(updated_node, updated_node.body)  # one import became several
        if original_node is self.plan.anchor and self.added:
            lines += [_import_line(m) for m in self.added]
        return lines[0] if len(lines) == 1 else cst.FlattenSentinel(lines)


def _split(
    line: cst.SimpleStatementLine, body: Sequence[cst.BaseSmallStatement]
) -> list[cst.SimpleStatementLine]:
    """One line per statement; the first keeps the comments above and after the line."""
    out = [line.with_changes(body=[body[0].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])]
    for stmt in body[1:]:
        out.append(
            cst.SimpleStatementLine(body=[stmt.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
        )
    return out
