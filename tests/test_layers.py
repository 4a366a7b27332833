"""The library's structure: its layers run one way (the import-linter contract in
pyproject.toml), no module imports itself through others, and no module imports another's
private name, and no module passes 800 lines. Function-local imports count as imports."""
import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "dlas_predict"


def _lint(config: Path) -> subprocess.CompletedProcess:
    script = ("import sys; from importlinter.cli import lint_imports; "
              "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))")
    return subprocess.run([sys.executable, "-c", script, str(config)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_the_layers_contract_holds():
    r = _lint(ROOT / "pyproject.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 kept, 0 broken" in r.stdout


def test_the_layers_contract_fails_on_an_upward_import(tmp_path):
    """The same contract, read by the same tool, on a copy of the package with one
    function-local import from a low layer to a high one."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "dlas_predict",
                    ignore=shutil.ignore_patterns("__pycache__", "_shipped"))
    config = copy / "dlas_predict" / "space" / "config.py"
    config.write_text(config.read_text() + "\n\ndef _upward():\n"
                      "    from dlas_predict.recommend.search import recommend\n"
                      "    return recommend\n")
    (copy / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    env_script = ("import sys; sys.path.insert(0, sys.argv[2]); "
                  "from importlinter.cli import lint_imports; "
                  "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, "
                  "no_logo=True))")
    r = subprocess.run([sys.executable, "-c", env_script, str(copy / "pyproject.toml"),
                        str(copy)], capture_output=True, text=True, cwd=copy, timeout=120)
    assert r.returncode != 0
    assert "dlas_predict.space is not allowed to import dlas_predict.recommend" in r.stdout


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "_shipped" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]):
    """(imported module, imported name or None) for every import in the module, at any
    depth."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    yield a.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in modules:
                    yield full, None
                elif node.module in modules:
                    yield node.module, a.name


def test_no_module_imports_itself_through_others():
    modules = _modules()
    graph = {m: {dep for dep, _ in _imports(m, p, modules) if dep != m}
             for m, p in modules.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return False

    circles = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                      if reaches(b, a)})
    assert circles == [], f"import circles through: {circles}"


def test_no_module_imports_another_modules_private_name():
    modules = _modules()
    private = sorted({(m, dep, n) for m, p in modules.items()
                      for dep, n in _imports(m, p, modules)
                      if n is not None and n.startswith("_") and dep != m})
    assert private == [], private


def test_no_module_is_longer_than_800_lines():
    """A module past 800 lines holds more than one job: split it by role."""
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > 800}
    assert long == {}, long
