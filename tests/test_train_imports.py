"""The Python training tools (tools/train/) import each other without a cycle, counting imports inside
functions too: a module reached again while it is still loading sees it half-initialized, and a
lazy import only hides the circle until a caller takes that path. Reads the sources (ast), so it
needs none of their packages (torch, gguf). Usage: test_train_imports.py [tools/train dir]."""
import ast
import pathlib
import sys

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train")
local = {p.stem: p for p in folder.glob("*.py")}
imports = {}
for name, path in local.items():
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    imports[name] = sorted(found & local.keys() - {name})


def cycle_from(start):
    """The first import path from `start` back to itself, or None (depth-first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        name, path = stack.pop()
        for child in imports[name]:
            if child == start:
                return path + [start]
            if child not in seen:
                seen.add(child)
                stack.append((child, path + [child]))
    return None


def canonical(cycle):
    """One cycle however it is entered: rotated to start at its least module."""
    ring = cycle[:-1]
    i = ring.index(min(ring))
    return tuple(ring[i:] + ring[:i] + [ring[i]])


cycles = {canonical(c) for c in map(cycle_from, sorted(imports)) if c}
for c in sorted(cycles):
    print(f"{folder}: import cycle " + " -> ".join(f"{m}.py" for m in c), file=sys.stderr)
if not local:
    sys.exit(f"{folder}: no Python files")
print(f"{len(local)} modules, {sum(map(len, imports.values()))} local imports, import cycles: {len(cycles)}")
sys.exit(1 if cycles else 0)
