"""The package's layering, read from its imports: `plugins > app > study > tasks > evaluation > analysis > store >
core`, with `controls` and `backends` (which only the app imports) above `core`; `plugins` is the Hydra plugin
package `hydra_plugins/` beside `steer_hydra/` (Hydra imports it; nothing in `steer_hydra` may). Inside a layer,
modules import each other without a circle.

Every `import` and `from ... import` in `steer_hydra/` (module level and inside functions) is parsed with `ast`,
and so is every string that names a module (`"steer_hydra.backends.huggingface:HFBackend"`, what `importlib`
loads by name). An edge from one layer to a layer it may not import fails the test, naming the file, the line
and the allowed layers. The one dotted-name seam is core's backend registry (`core/backend.py` `BACKENDS`),
which finds backend classes by kind without importing them until one is used.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = "steer_hydra"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# layer -> the other layers it may import. `testing` (scaffolding for tests and benchmarks) may import any
# library layer and nothing in the package imports it; `conf` is the config data the app composes.
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "models": frozenset(),
    "controls": frozenset({"core"}),
    "backends": frozenset({"core", "models"}),
    "store": frozenset({"core"}),
    "analysis": frozenset({"store", "core"}),
    "evaluation": frozenset({"analysis", "store", "core"}),
    "tasks": frozenset({"evaluation", "core"}),
    "study": frozenset({"tasks", "evaluation", "analysis", "store", "core"}),
    "app": frozenset(
        {"study", "tasks", "evaluation", "analysis", "store", "controls", "backends", "core", "models", "conf"}
    ),
    "conf": frozenset(),
    "testing": frozenset({"tasks", "evaluation", "analysis", "store", "controls", "backends", "core", "models"}),
}
PLUGINS = "hydra_plugins"  # the Hydra plugin package: the top layer, importing the app and the study
ALLOWED[PLUGINS] = frozenset(
    {"app", "study", "tasks", "evaluation", "analysis", "store", "controls", "backends", "core", "models", "conf"}
)
PLUGINS_ROOT = ROOT.parent / PLUGINS
# modules at the package root belong to the app layer (entry points, the package's own re-exports)
TOP_LEVEL_LAYER = "app"
# (file relative to the package root, layer it may name as a string): the documented by-name seams
SEAMS = frozenset({("core/backend.py", "backends")})

_DOTTED = re.compile(rf"^{PACKAGE}(\.\w+)+(:\w+)?$")


def layer_of(path: Path, root: Path) -> str:
    if root.name == PLUGINS:
        return PLUGINS
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else TOP_LEVEL_LAYER


def _package_of(path: Path, root: Path) -> list[str]:
    return [root.name, *path.relative_to(root).parent.parts]


def imported_names(path: Path, root: Path) -> list[tuple[int, str, bool]]:
    """`(line, dotted module, by_string)` for every import in the file, at any depth, plus dotted strings."""
    found: list[tuple[int, str, bool]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path, root)
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == PACKAGE:  # `from steer_hydra import tasks`
                found += [(node.lineno, f"{PACKAGE}.{alias.name}", False) for alias in node.names]
            else:
                found.append((node.lineno, module, False))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.match(node.value):
            found.append((node.lineno, node.value.partition(":")[0], True))
    return found


def upward_edges(root: Path) -> list[str]:
    """Every import in the tree under `root` (a `steer_hydra` package folder, or the `hydra_plugins` folder beside
    it) that breaks `ALLOWED`."""
    problems = []
    package_root = root if root.name == PACKAGE else root.parent / PACKAGE
    for path in sorted(root.rglob("*.py")):
        source = layer_of(path, root)
        for line, module, by_string in imported_names(path, root):
            parts = module.split(".")
            if parts[0] == PLUGINS:
                target = PLUGINS
            elif parts[0] != PACKAGE or len(parts) < 2:
                continue
            else:
                top_module = (package_root / f"{parts[1]}.py").exists()
                target = parts[1] if parts[1] in ALLOWED else (TOP_LEVEL_LAYER if top_module else "")
            if not target or target == source or target in ALLOWED[source]:
                continue
            if by_string and (path.relative_to(root).as_posix(), target) in SEAMS:
                continue
            how = "names by string" if by_string else "imports"
            allowed = ", ".join(sorted(ALLOWED[source])) or "no other layer"
            problems.append(
                f"{path.relative_to(root.parent).as_posix()}:{line}: {source} {how} {module} ({target}); "
                f"{source} may import {allowed}"
            )
    return problems


def _module_file(dotted: str, package_root: Path) -> Path | None:
    """The file of a dotted `steer_hydra...` module (a package's `__init__.py`), None outside the package."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    base = package_root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_circles(root: Path) -> list[list[str]]:
    """Circles of imports (module level or inside functions) among the modules of one layer, each as the sorted
    module paths of a strongly connected component; a package's `__init__.py` re-exporting its modules is left out
    (it imports them, they never need it)."""
    graph: dict[Path, set[Path]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        edges = graph.setdefault(path, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            for dotted in targets:
                target = _module_file(dotted, root)
                if target is None or target.name == "__init__.py" or target == path:
                    continue
                if layer_of(target, root) == layer_of(path, root):
                    edges.add(target)
                    break  # `from a.b import c`: the submodule when it is one, else the module
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    circles: list[list[str]] = []

    def visit(node: Path) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member.relative_to(root).as_posix())
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return sorted(circles)


def test_no_import_circle_inside_a_layer():
    assert import_circles(ROOT) == []


def test_the_circle_checker_finds_a_circle_through_a_function_level_import(tmp_path):
    files = {
        "app/judge.py": "from steer_hydra.app import schema\n",
        "app/schema.py": "def f():\n    from steer_hydra.app.plan import ConfigError\n",
        "app/plan.py": "from steer_hydra.app.judge import check\nfrom steer_hydra.core import x\n",
        "app/job.py": "from steer_hydra.app.plan import JobPlan\n",
        "core/x.py": "",
    }
    assert import_circles(_tree(tmp_path, files)) == [["app/judge.py", "app/plan.py", "app/schema.py"]]


def test_every_subpackage_has_a_layer():
    packages = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert [p for p in packages if p not in ALLOWED] == []


def test_no_import_points_up_a_layer():
    assert upward_edges(ROOT) == []


def test_the_hydra_plugins_import_down_only_and_nothing_imports_them():
    assert sorted(PLUGINS_ROOT.rglob("*.py")), "the study sweeper plugin is where the test looks"
    assert upward_edges(PLUGINS_ROOT) == []
    assert not [p for p in upward_edges(ROOT) if PLUGINS in p]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / PACKAGE
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "flagged"),
    [
        # a function-level import of a higher layer (how the old suite.py reached tasks)
        (
            {"evaluation/suite.py": "def run():\n    import steer_hydra.tasks  # noqa\n"},
            ["steer_hydra/evaluation/suite.py:2: evaluation imports steer_hydra.tasks (tasks)"],
        ),
        ({"core/x.py": "from steer_hydra.evaluation.provider import ProviderOptions\n"}, ["core/x.py:1: core imports"]),
        ({"controls/c.py": "from steer_hydra import backends\n"}, ["controls/c.py:1: controls imports"]),
        ({"core/pipeline.py": "from . import x\nfrom ..app import job\n"}, ["core/pipeline.py:2: core imports"]),
        ({"core/y.py": "KINDS = {'x': 'steer_hydra.backends.x:X'}\n"}, ["core/y.py:1: core names by string"]),
        ({"backends/b.py": "from steer_hydra.testing.loopback import Server\n"}, ["backends/b.py:1: backends"]),
        ({"tasks/t.py": "from steer_hydra.main import main\n"}, ["tasks/t.py:1: tasks imports steer_hydra.main (app)"]),
        # the app reaching into the Hydra plugin package (how callbacks once read the sweeper's file name)
        ({"app/c.py": "from hydra_plugins.s.sweeper import NAME\n"}, ["app/c.py:1: app imports hydra_plugins.s"]),
        ({"study/r.py": "from steer_hydra.app.plan import to_plain\n"}, ["study/r.py:1: study imports"]),
    ],
)
def test_the_checker_flags_an_upward_import(tmp_path, files, flagged):
    problems = upward_edges(_tree(tmp_path, {"main.py": "", **files}))
    assert len(problems) == len(flagged)
    for problem, start in zip(problems, flagged, strict=True):
        assert start in problem


def test_the_checker_passes_downward_imports_and_the_backend_seam(tmp_path):
    files = {
        "app/job.py": "from steer_hydra.tasks import x\nimport steer_hydra.conf\n",
        "tasks/t.py": "def f():\n    from steer_hydra.evaluation.solvers import s\n",
        "backends/hf.py": "from steer_hydra.models import m\nfrom steer_hydra.core.backend import Backend\n",
        "core/backend.py": "BACKENDS = {'huggingface': 'steer_hydra.backends.huggingface:HFBackend'}\n",
        "testing/server.py": "from steer_hydra.core.output import strip_trailing\n",
    }
    assert upward_edges(_tree(tmp_path, files)) == []
