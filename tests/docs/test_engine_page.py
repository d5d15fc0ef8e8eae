"""docs/engine.md, the engine's page for a maintainer, keeps up with project/engine/: a section per module in the run
order project/engine/__init__.py lists, and every definition of upstream.py named in it."""

import ast
import re

from scripts.mutants import guards_lines, route_table_guards
from tests.helpers import REPO

ENGINE = REPO / "project" / "engine"
PAGE = REPO / "docs" / "engine.md"


def engine_modules() -> set[str]:
    return {path.stem for path in ENGINE.glob("*.py") if path.stem != "__init__"}


def listed_in_run_order() -> list[str]:
    """The modules `project/engine/__init__.py`'s docstring lists, one `- name: ...` line each, in run order."""
    docstring = ast.get_docstring(ast.parse((ENGINE / "__init__.py").read_text())) or ""
    return re.findall(r"^- (\w+)\b", docstring, flags=re.MULTILINE)


def page_sections() -> list[str]:
    """The modules the page's `## `<module>.py`: ...` headings name, in page order."""
    return re.findall(r"^## `(\w+)\.py`", PAGE.read_text(), flags=re.MULTILINE)


def upstream_definitions() -> set[str]:
    """The top-level functions, classes and assigned names of project/engine/upstream.py."""
    tree = ast.parse((ENGINE / "upstream.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_the_engine_package_lists_every_module_it_holds_and_no_other():
    listed = listed_in_run_order()
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == engine_modules()


def test_the_page_has_a_section_per_engine_module_in_run_order():
    sections = page_sections()
    assert set(sections) == engine_modules()
    assert sections == listed_in_run_order()


def test_the_page_names_every_definition_of_upstream_py():
    text = PAGE.read_text()
    unnamed = sorted(name for name in upstream_definitions() if f"`{name}`" not in text)
    assert not unnamed, f"docs/engine.md's upstream table lacks {unnamed}"


def test_the_route_table_and_the_guards_lines_name_one_list_of_test_files_per_module():
    """`make mutants` runs each module's mutants against the route table's files: the text must not name others."""
    table, sections = route_table_guards(), guards_lines()
    assert set(table) == engine_modules()
    differing = {
        module: (table[module], sections.get(module)) for module in table if table[module] != sections.get(module)
    }
    assert not differing, f"route table vs Guards lines of docs/engine.md: {differing}"
    missing = sorted(name for files in table.values() for name in files if not (REPO / "tests" / name).exists())
    assert not missing, missing
