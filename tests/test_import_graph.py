"""Imports run one way: app.py -> ui -> (explainer, visuals); the library never imports gradio or the UI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Top-level names of the modules a file imports (`import a.b`, `from a.b import c` -> "a"); relative imports
    resolve inside the file's own package, so they are left out."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def files(*folders: str) -> list[Path]:
    out = [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]
    assert out, folders
    return out


@pytest.mark.parametrize("path", files("explainer", "visuals"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_library_imports_neither_gradio_nor_the_ui(path):
    assert not imported_modules(path) & {"gradio", "ui", "app"}


@pytest.mark.parametrize("path", files("ui", "scripts"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_app_py_imports_the_ui(path):
    banned = {"app"} if ROOT / "ui" in path.parents else {"app", "ui"}
    assert not imported_modules(path) & banned


def test_the_scan_sees_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import gradio as gr\nfrom ui.models import get_bundle\nfrom . import x\nimport os.path\n")
    assert imported_modules(probe) == {"gradio", "ui", "os"}
    assert imported_modules(ROOT / "app.py") >= {"gradio", "ui"}



# --- scripts -------------------------------------------------------------------------------------------------------
# Scripts are thin front ends: what two of them share lives in the library, and no script imports another (style
# guide, point 22). The pairs below belong to branches that turn them into library code or options; the lead empties
# this at their merge.
PENDING_SCRIPT_IMPORTS: set[tuple[str, str]] = set()


def script_imports(folder: Path = ROOT / "scripts") -> set[tuple[str, str]]:
    """(script file, script module) for every import of one script by another in `folder`."""
    names = {p.stem for p in folder.glob("*.py")}
    return {(p.name, m) for p in sorted(folder.glob("*.py")) for m in imported_modules(p) & names}


def test_no_script_imports_another():
    assert script_imports() - PENDING_SCRIPT_IMPORTS == set()


def test_the_script_check_sees_an_import(tmp_path):
    (tmp_path / "a.py").write_text("import json\n\ndef f():\n    from b import helper\n")
    (tmp_path / "b.py").write_text("from explainer.bench import synthetic\n")
    assert script_imports(tmp_path) == {("a.py", "b")}

# --- import cycles -------------------------------------------------------------------------------------------------
# Every import counts, at module level and inside functions: an import placed in a function is for an optional
# dependency or start-up cost, never to hide a cycle (style guide, point 15). Imports under `if TYPE_CHECKING:` never
# run and are left out.

PACKAGES = ("explainer", "ui", "visuals")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST):
    """The Import/ImportFrom nodes of a tree, leaving out the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` an import names. `from pkg import x` is pkg.x when x is a submodule, else pkg itself;
    the parent packages Python runs on the way (explainer/__init__ for `import explainer.models.vision`) are not
    counted: they are edges only when the import names the package itself."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.add(sub)
        elif base in known:
            out.add(base)
    return out


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports (anywhere in the file)."""
    paths = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    known = set(paths)
    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _runtime_imports(tree):
            edges |= _targets(node, name, is_package, known)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every module in one can
    reach every other through imports."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def describe(component: tuple[str, ...], graph: dict[str, set[str]]) -> str:
    """One import path around a component, e.g. "a -> b -> a", for the failure message."""
    start, members = component[0], set(component)
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [m for m in nxt if m == start]
        if back and len(path) > 1:
            return " -> ".join([*path, start])
        fresh = [m for m in nxt if m not in seen]
        step = fresh[0] if fresh else nxt[0]
        if step in seen:
            return " -> ".join([*path[path.index(step) :], step])
        path.append(step)
        seen.add(step)


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph) for c in found)


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def test_the_cycle_check_sees_a_planted_cycle(tmp_path):
    _plant(
        tmp_path,
        {
            "explainer/__init__.py": "from .a import f\n",
            "explainer/a.py": "def f():\n    from .b import g  # inside a function: still an edge\n    return g()\n",
            "explainer/b.py": "from explainer import a\n",
            "explainer/sub/__init__.py": "from .c import h\n",  # a package importing its own submodule: fine
            "explainer/sub/c.py": "from explainer.sub.d import k\ndef h():\n    return k\n",
            "explainer/sub/d.py": "import os\nk = 1\n",
            "ui/__init__.py": "",
            "ui/x.py": "from . import y\n",  # y is a submodule: an edge to ui.y
            "ui/y.py": "from ui import x\n",
            "visuals/__init__.py": "",
            "visuals/p.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from visuals import q\n",
            "visuals/q.py": "from visuals.p import thing\n",
        },
    )
    graph = import_graph(tmp_path)
    assert graph["explainer.a"] == {"explainer.b"}
    assert graph["explainer.sub.c"] == {"explainer.sub.d"}  # not explainer.sub: the package is not named
    assert graph["visuals.p"] == set()  # TYPE_CHECKING imports never run
    found = cycles(graph)
    assert found == [("explainer.a", "explainer.b"), ("ui.x", "ui.y")]
    assert describe(found[0], graph) == "explainer.a -> explainer.b -> explainer.a"


def test_importing_a_name_from_the_package_is_an_edge_to_its_init(tmp_path):
    _plant(
        tmp_path,
        {
            "explainer/__init__.py": "",
            "explainer/pkg/__init__.py": "from .m import f\nVALUE = 1\n",
            "explainer/pkg/m.py": "def f():\n    from . import VALUE\n    return VALUE\n",
            "ui/__init__.py": "",
            "visuals/__init__.py": "",
        },
    )
    graph = import_graph(tmp_path)
    assert graph["explainer.pkg.m"] == {"explainer.pkg"}
    assert cycles(graph) == [("explainer.pkg", "explainer.pkg.m")]


# --- layers --------------------------------------------------------------------------------------------------------
# The folders are the layers (docs/architecture.md, "Why this layout"), lowest first; a module may import its own
# layer and the ones below, never one above. Within explainer/ a layer is the first name under explainer/.
LAYERS = (
    ("errors", "contrast"),  # leaves: typed errors, contrastive targets
    ("runtime",),  # devices, memory, precision, threads, the per-model lock
    ("models",),  # loading, tokens, images, vision-language prompts
    ("capture",),  # attention rows through AttentionInterface
    ("result",),  # the Attribution and what is computed from it
    ("methods",),  # the attribution methods and their registry
    ("request",),  # ExplainRequest (explainer/request.py): checked with the registry
    ("decoding", "estimate", "reliance"),  # the decode layer (explainer/decoding/); estimates; knockout
    ("explain",),  # the request orchestration
    ("faithfulness",),  # removal curves and pi-Soft, with their metrics (what the app's faithfulness panel runs)
    ("eval", "bench"),  # evaluation over data sets, and measurement: they may run faithfulness, never the reverse
    ("visuals",),  # pure views
    ("cli", "__main__", "explainer"),  # front ends of the library; `explainer` is its public __init__
    ("ui",),  # the Gradio app
)
LAYER_OF = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYER_OF[parts[1] if parts[0] == "explainer" and len(parts) > 1 else parts[0]]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def test_imports_run_one_way():
    assert upward_imports(import_graph()) == []


def test_every_module_has_a_layer():
    for module in import_graph():
        layer(module)  # a new top-level module or package needs a place in LAYERS (KeyError otherwise)


def test_the_layer_check_sees_an_upward_import():
    graph = {"explainer.runtime.memory": {"explainer.capture", "explainer.errors"}, "ui.models": {"explainer"}}
    assert upward_imports(graph) == ["explainer.runtime.memory -> explainer.capture"]


def test_faithfulness_sits_below_eval():
    """faithfulness/ holds its own metrics: an import of eval/ from it is upward (issue 54, item 7)."""
    graph = {
        "explainer.faithfulness.soft": {"explainer.eval.metrics"},
        "explainer.eval.evaluate": {"explainer.faithfulness"},
    }
    assert upward_imports(graph) == ["explainer.faithfulness.soft -> explainer.eval.metrics"]


# --- optional extras -----------------------------------------------------------------------------------------------
PEER_PACKAGES = {"context_cite", "at2", "nltk", "spacy", "datasets", "scipy", "sklearn"}  # .[peers] and what it brings
PEERS_MODULE = ROOT / "explainer" / "eval" / "peers.py"


def module_level_imports(path: Path) -> set[str]:
    """Top-level names imported by the file's module-level statements (not inside functions or classes)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", files("explainer", "visuals", "ui"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_peers_are_optional(path):
    """Only eval/peers.py imports the `.[peers]` extras, and only inside its functions: the app and the library
    import without them."""
    if path == PEERS_MODULE:
        assert not module_level_imports(path) & PEER_PACKAGES
    else:
        assert not imported_modules(path) & PEER_PACKAGES
    assert not imported_modules(ROOT / "app.py") & PEER_PACKAGES


def test_the_optional_check_sees_a_module_level_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import numpy\nfrom context_cite import ContextCiter\n\ndef f():\n    import at2\n")
    assert module_level_imports(probe) == {"numpy", "context_cite"}
    assert imported_modules(probe) >= {"context_cite", "at2"}
