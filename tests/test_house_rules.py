"""The house rules the code keeps (read from the syntax tree, not grepped): rooms of one concern, of
a size that concern needs, in folders a reader can take in at a glance; short parameter lists;
tasks that do not depend on the runner; weight routes chosen in one place."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lit_asyncrl"
#: A safety net, not a target: a module is as long as its one concern needs, and one past this
#: holds more than one.
MAX_LINES = 450
#: Folders a reader takes in at a glance: at most this many modules directly in each folder of
#: `rollout/` and `envs/` (`__init__.py` included; `losses/`, one class per strategy, is not held to it).
MAX_MODULES_PER_FOLDER = 12
#: Parameters of an internal function or method (self and cls not counted).
MAX_PARAMETERS = 7
#: Constructors users configure through Hydra or the Lightning CLI: their arguments are config keys,
#: as Lightning's CLI expects, so they are held to no parameter limit.
CONFIGURED_CONSTRUCTORS = (
    "envs/",
    "losses/",
    "reference/",
    "models/",
    "module.py",
    "datamodule.py",
    "trainer_callbacks/",
)
#: The weight routes' names (`rollout.weight_transfer`): compared only where a route is chosen.
ROUTE_NAMES = {"file", "staged", "gloo", "nccl", "ipc"}
ROUTE_CHOICE = "rollout/weights/choice.py"
#: Places that compare one of those strings for another reason, and why.
OTHER_MEANINGS = {
    # torch.distributed's process-group backend of the DDP trainer, not a weight route.
    "rollout/serving/distributed.py",
}


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


def test_every_module_is_at_most_450_lines():
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {name: length for name, length in lengths.items() if length > MAX_LINES} == {}


def test_no_folder_of_rollout_or_envs_holds_more_than_12_modules():
    folders = [PACKAGE / "rollout", PACKAGE / "envs"]
    folders += [
        folder
        for root in list(folders)
        for folder in root.rglob("*")
        if folder.is_dir() and folder.name != "__pycache__"
    ]
    crowded = {folder.relative_to(PACKAGE).as_posix(): len(list(folder.glob("*.py"))) for folder in folders}
    assert {folder: count for folder, count in crowded.items() if count > MAX_MODULES_PER_FOLDER} == {}
    assert (PACKAGE / "rollout" / "__init__.py").exists()


def parameter_counts(path: Path) -> dict[str, int]:
    """Each function and method of `path` ("Class.method" or "function") and its parameters, self
    and cls not counted, `*args` and `**kwargs` counted once each."""
    counts = {}
    tree = ast.parse(path.read_text())
    owners = {child: node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for child in node.body}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args
        names = [argument.arg for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
        if names and names[0] in ("self", "cls") and node in owners:
            names = names[1:]
        qualified = f"{owners[node]}.{node.name}" if node in owners else node.name
        counts[qualified] = len(names) + (arguments.vararg is not None) + (arguments.kwarg is not None)
    return counts


def test_no_internal_function_takes_more_than_7_parameters():
    """Settings travel as typed objects, not as long argument lists; the constructors users configure
    are exempt (their arguments are config keys)."""
    offenders = {}
    for name, path in modules().items():
        for function, count in parameter_counts(path).items():
            configured = function.endswith(".__init__") and name.startswith(CONFIGURED_CONSTRUCTORS)
            if count > MAX_PARAMETERS and not configured:
                offenders[f"{name}:{function}"] = count
    assert offenders == {}


def test_the_parameter_count_leaves_out_self_and_counts_star_arguments(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("class A:\n    def f(self, a, *rest, b, **named):\n        pass\n\ndef g(self, x):\n    pass\n")
    assert parameter_counts(source) == {"A.f": 4, "g": 2}


def packed_assignments(path: Path) -> list[int]:
    """Lines of `path` that assign a tuple of values to a tuple of names (`a, b = x, y`): one statement
    per assignment reads better; a swap (`a, b = b, a`) is the exception, and unpacking a returned
    tuple (`a, b = f()`) is no packing."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Tuple)
        ):
            targets = sorted(ast.unparse(element) for element in node.targets[0].elts)
            if targets != sorted(ast.unparse(element) for element in node.value.elts):
                found.append(node.lineno)
    return found


def test_one_assignment_per_statement():
    offenders = {name: lines for name, path in modules().items() if (lines := packed_assignments(path))}
    assert offenders == {}


def test_the_packing_check_leaves_swaps_and_unpacked_returns_alone(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("a, b = 1, 2\na, b = b, a\nc, d = divmod(7, 2)\nself.x, y = y, None\n")
    assert packed_assignments(source) == [1, 4]


def route_name_comparisons(path: Path) -> list[str]:
    """The route names `path` compares something with (`==`, `!=`, `in`, `not in`, or a `match` case)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                elements = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                found += [
                    element.value
                    for element in elements
                    if isinstance(element, ast.Constant) and element.value in ROUTE_NAMES
                ]
        elif (
            isinstance(node, ast.MatchValue)
            and isinstance(node.value, ast.Constant)
            and node.value.value in ROUTE_NAMES
        ):
            found.append(node.value.value)
    return found


def test_only_the_route_choice_compares_a_routes_name():
    """A route is a class chosen once from the settings; nothing else branches on its name."""
    offenders = {name: found for name, path in modules().items() if (found := route_name_comparisons(path))}
    assert set(offenders) == {ROUTE_CHOICE, *OTHER_MEANINGS}


def test_the_route_name_check_sees_comparisons_and_membership(tmp_path):
    source = tmp_path / "module.py"
    source.write_text('if route == "staged" or backend in ("nccl", "ipc"):\n    pass\nlabel = "file"\n')
    assert route_name_comparisons(source) == ["staged", "nccl", "ipc"]


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


#: Underscored names that are public APIs (the stdlib's `os._exit` and `sys._current_frames`, namedtuple's
#: `_replace`...).
PUBLIC_UNDERSCORED = {"_exit", "_current_frames", "_replace", "_asdict", "_fields", "_make"}
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
        if (
            not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            and node.attr not in PUBLIC_UNDERSCORED
        ):
            found.add(node.attr)
    return found


def test_no_room_reads_or_writes_another_objects_private_attributes():
    offenders = {
        (name, attribute) for name, path in modules().items() for attribute in foreign_private_attributes(path)
    }
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
    source.write_text(
        "class _Bind(L.Callback):\n    pass\n\nclass Public(L.Callback):\n    pass\n\nclass _Helper:\n    pass\n"
    )
    assert private_callback_classes(source) == ["_Bind"]


TESTS = Path(__file__).resolve().parent


def suite_modules() -> list[Path]:
    """Every test module and conftest of the suite."""
    return sorted(path for path in TESTS.rglob("*.py") if path.name.startswith("test_") or path.name == "conftest.py")


def imported_test_modules(path: Path, test_module_names: set[str]) -> set[str]:
    """The test modules and conftests `path` imports, at its top or inside a function: a `tests.…` (or
    relative) module whose last part starts with `test_` or is `conftest`, and a top-level module named
    as a test module is (a test folder without `__init__.py` is on sys.path: its files import by name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module if node.level == 0 else ".".join(filter(None, ["tests", node.module]))
            dotted = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in dotted:
            parts = name.split(".")
            under_tests = (
                parts[0] == "tests" and len(parts) > 1 and (parts[-1].startswith("test_") or parts[-1] == "conftest")
            )
            top_level = len(parts) == 1 and (name in test_module_names or name == "conftest")
            if under_tests or top_level:
                found.add(name)
    return found


def test_no_test_module_imports_another_test_module_or_a_conftest():
    """What two test modules share (fakes, the scripted engine, config helpers...) lives in tests/support/."""
    modules = suite_modules()
    names = {path.stem for path in modules if path.name != "conftest.py"}
    offenders = {
        path.relative_to(TESTS).as_posix(): sorted(found)
        for path in modules
        if (found := imported_test_modules(path, names))
    }
    assert offenders == {}, "move what they share to tests/support/"


def test_the_test_module_check_sees_imports_of_test_modules_and_conftests(tmp_path):
    source = tmp_path / "test_sample.py"
    source.write_text(
        "from tests.unit.test_lora import adapted\nimport tests.integration.conftest\nfrom tests.support.fakes import FakeEngine\n"
        "def helper():\n    from test_producer import wait_for\n    from . import test_cleanup\n    import ewma_models\n"
    )
    found = imported_test_modules(source, {"test_producer"})
    assert found == {"tests.unit.test_lora", "tests.integration.conftest", "test_producer", "tests.test_cleanup"}
