"""The house rules the code keeps (read from the syntax tree, not grepped): small rooms, and tasks
that do not depend on the runner."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lit_asyncrl"
MAX_LINES = 350
#: Rooms still over the limit, each with its length today: they are to be split (the house issue),
#: so this list only shrinks. A listed file that grows, or drops under the limit, fails too.
STILL_TOO_LONG: dict[str, int] = {}


def modules() -> dict[str, Path]:
    return {path.relative_to(PACKAGE).as_posix(): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
    return found


def test_every_room_is_at_most_350_lines():
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    too_long = {name: length for name, length in lengths.items() if length > MAX_LINES and name not in STILL_TOO_LONG}
    assert too_long == {}
    assert {name: lengths[name] for name in STILL_TOO_LONG} == {
        name: min(lengths[name], limit) for name, limit in STILL_TOO_LONG.items()
    }, "a listed room grew"
    assert [name for name in STILL_TOO_LONG if lengths[name] <= MAX_LINES] == [], "split now: take it off the list"


def test_tasks_do_not_import_the_runner():
    offenders = {
        name: sorted(module for module in imported_modules(path) if module.startswith("lit_asyncrl.rollout"))
        for name, path in modules().items()
        if name.startswith("envs/")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("def start():\n    from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine\n")
    assert imported_modules(source) == {"lit_asyncrl.rollout.engine.vllm_engine"}


#: Underscored names that are public APIs (the stdlib's `os._exit`, namedtuple's `_replace`...).
PUBLIC_UNDERSCORED = {"_exit", "_replace", "_asdict", "_fields", "_make"}
#: Private attributes of other libraries' objects that a room must touch, and why.
THIRD_PARTY_WORKAROUNDS = {
    # Lightning's child-process watcher has no public way to stop watching ranks we end ourselves.
    ("lifecycle.py", "_child_processes"),
}


def foreign_private_attributes(path: Path) -> set[str]:
    """`x._name` in `path` where `x` is not `self` or `cls`: another object's private attribute."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) and node.attr not in PUBLIC_UNDERSCORED:
            found.add(node.attr)
    return found


def test_no_room_reads_or_writes_another_objects_private_attributes():
    offenders = {(name, attribute) for name, path in modules().items() for attribute in foreign_private_attributes(path)}
    assert offenders == THIRD_PARTY_WORKAROUNDS


def test_the_private_attribute_check_sees_reads_and_writes(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("def f(reference, other):\n    reference._retention = other._store\n    self._mine = os._exit\n")
    assert foreign_private_attributes(source) == {"_retention", "_store"}


def private_callback_classes(path: Path) -> list[str]:
    """Classes named `_X` deriving from a Lightning callback: glue that a contract should replace."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name.startswith("_"):
            bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
            if bases & {"Callback", "ServiceCallback"}:
                found.append(node.name)
    return found


def test_no_glue_callbacks():
    assert {name: found for name, path in modules().items() if (found := private_callback_classes(path))} == {}


def test_only_the_rollout_package_knows_the_concrete_service_and_its_buffer():
    """Outside `rollout/` the service is reached through its protocol: no import of the concrete
    service or its buffer, no read of a `.buffer`."""
    offenders = {}
    for name, path in modules().items():
        if name.startswith("rollout/"):
            continue
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        reads = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "buffer"}
        found = (imported & {"VLLMRolloutService", "RolloutBuffer"}) | reads
        if found:
            offenders[name] = sorted(found)
    assert offenders == {}


def test_the_glue_check_sees_private_callbacks(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("class _Bind(L.Callback):\n    pass\n\nclass Public(L.Callback):\n    pass\n\nclass _Helper:\n    pass\n")
    assert private_callback_classes(source) == ["_Bind"]
