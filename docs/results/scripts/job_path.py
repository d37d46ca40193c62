"""The live job path's import graph: who starts a job's processes, who waits for them, who imports
the job package, and that the commands do not borrow each other's wiring.

    python docs/results/scripts/job_path.py > docs/results/job-path.txt
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("costmodel", "envs", "agents", "runners")


def modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = "ncclrl." + ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            yield name, ast.parse(path.read_text())


def calls(tree: ast.AST, names: set[str]) -> list[str]:
    """Each function (qualified by its class) that calls one of ``names``."""
    out = []

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                here = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                f = child.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if called in names:
                    out.append(f"{where or '<module>'} calls {called}")
            visit(child, here)

    visit(tree, "")
    return sorted(set(out))


def main() -> None:
    importers, starts, loops = {}, [], []
    for name, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ncclrl.envs.jobs") \
                    and not name.startswith("ncclrl.envs.jobs"):
                importers.setdefault(name, set()).update(a.name for a in node.names)
        starts += [f"{name}: {c}" for c in calls(tree, {"Popen"})]
        loops += [f"{name}: {c}" for c in calls(tree, {"Job"})]
    print("# who starts processes (subprocess.Popen), in the whole package")
    print("\n".join(starts))
    print("\n# who makes a running job (Job): the one wait loop")
    print("\n".join(loops))
    print("\n# who imports the job package, and what")
    for name, what in sorted(importers.items()):
        print(f"{name}: {', '.join(sorted(what))}")


if __name__ == "__main__":
    main()
