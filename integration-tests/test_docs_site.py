"""The documentation site holds together: every page is in the nav, every relative link
and anchor resolves, every Ray name has its row in "Coming from Ray", and every Python
example at least compiles (the runnable ones run in ``test_docs_examples.py``).

No Ray and no lumos import: ``nox -s docs`` runs this with the docs tools only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import docs_blocks
import pytest
import yaml

PAGES = docs_blocks.pages()


def _nav() -> list[str]:
    config = yaml.safe_load(docs_blocks.MKDOCS_YML.read_text())
    return docs_blocks.nav_pages(config["nav"])


def test_every_page_is_in_the_nav_once_and_every_nav_entry_exists() -> None:
    nav = _nav()
    assert sorted(nav) == PAGES, "pages and nav differ"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def test_the_docs_have_the_pages_the_issue_asks_for() -> None:
    topics = [
        "getting-started.md",
        "guide/checkpoints.md",
        "guide/fault-tolerance.md",
        "guide/elastic.md",
        "guide/data.md",
        "guide/validation-health.md",
        "guide/tune.md",
        "guide/tune-over-train.md",
        "guide/integrations.md",
        "guide/clusters.md",
        "guide/dashboard.md",
        "coming-from-ray.md",
        "api/train.md",
        "api/train.torch.md",
        "api/tune.md",
        "api/storage.md",
        "api/runtime.md",
    ]
    assert [t for t in topics if t not in PAGES] == []


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_and_anchor_resolves(page: str) -> None:
    broken = []
    for target in docs_blocks.links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (docs_blocks.DOCS / page).parent / path if path else docs_blocks.DOCS / page
        dest = dest.resolve()
        if docs_blocks.DOCS.resolve() not in dest.parents or not dest.is_file():
            broken.append(f"{target}: no such file under docs/")
        elif anchor and dest.suffix == ".md":
            rel = dest.relative_to(docs_blocks.DOCS.resolve()).as_posix()
            if anchor not in docs_blocks.anchors(rel):
                broken.append(f"{target}: no heading #{anchor} in {rel}")
    assert broken == [], f"{page}: {broken}"


def test_the_anchor_rule_is_python_markdowns() -> None:
    assert docs_blocks.slug("Fine-tuning starts: `resume_from_checkpoint`") == (
        "fine-tuning-starts-resume_from_checkpoint"
    )
    assert docs_blocks.slug("Experiment tracking in Train: MLflow and W&B") == (
        "experiment-tracking-in-train-mlflow-and-wb"
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_python_example_compiles_and_every_skip_says_why(page: str) -> None:
    for block in docs_blocks.blocks(page):
        if block.lang != "python":
            assert block.no_test is None, f"{page}:{block.line}: no-test on a {block.lang} block"
            continue
        ast.parse(block.code, f"{page}:{block.line}")


def _ray_public_names() -> dict[str, set[str]]:
    """Ray's public Train and Tune names, from its installed sources (``__all__``, and for
    ``ray.train`` what it imports from ``v2.api``), parsed: no Ray import."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        pytest.skip("ray is not installed here: nothing to compare with")
    ray_dir = Path(spec.origin).parent
    modules = [
        "train/__init__.py",
        "train/torch/__init__.py",
        "train/lightning/__init__.py",
        "train/huggingface/transformers/__init__.py",
        "tune/__init__.py",
        "tune/schedulers/__init__.py",
        "tune/search/__init__.py",
        "tune/search/optuna/__init__.py",
        "tune/stopper/__init__.py",
        "tune/logger/__init__.py",
    ]
    out: dict[str, set[str]] = {}
    for module in modules:
        names: set[str] = set()
        for node in ast.walk(ast.parse((ray_dir / module).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and "v2.api" in node.module:
                names.update(alias.asname or alias.name for alias in node.names)
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names.update(ast.literal_eval(node.value))
        out[module] = names
    return out


def test_coming_from_ray_names_every_public_ray_train_and_tune_name() -> None:
    code = " ".join(re.findall(r"`([^`]+)`", docs_blocks.prose("coming-from-ray.md")))
    missing = {
        module: sorted(n for n in names if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", code))
        for module, names in _ray_public_names().items()
    }
    assert {m: n for m, n in missing.items() if n} == {}
