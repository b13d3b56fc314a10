"""The package's layers: every import inside ct2_flash points down (or stays in its layer),
function-local imports included, and no module reaches for another layer's private names."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bottom to top, by folder. A module may import from its own layer or any layer below it.
LAYERS = [
    ("engine", "stock"),  # the CTranslate2 runtimes (patched here, stock in a worker) and model files
    (
        "drafting",
    ),  # drafters: interface, registry, prompt lookup, previous hypothesis, reference drafters, trained rounds
    ("loop", "redecodes"),  # the decode loop; re-decodes (the windows a thread decoded last)
    ("adapter",),  # the faster-whisper adapter: model classes, proxy, routes, engines, audio checks
    ("dropin", "validation", "jobs"),  # drop-in, exactness checks, collections/outputs/streaming
    ("benchmark", "train", "converters"),
    ("cli", "__init__"),  # the command line; the package's public names
]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
PACKAGE = os.path.join(ROOT, "ct2_flash")


def package_files():
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, ".")
                yield path, f"ct2_flash.{relative}".replace(".__init__", "") if relative != "__init__" else "ct2_flash"


def part_of(module: str) -> str:
    """ct2_flash.loop.decoding -> runtime; ct2_flash.adapter.whisper_model -> whisper_model."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: str, module: str):
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


def test_imports_point_down_the_layers():
    upward, private = [], []
    for path, module in package_files():
        source = part_of(module)
        assert source in LAYER_OF, f"{module}: add its part {source!r} to a layer in tests/test_layout.py"
        for line, target, names in imports_of(path, module):
            if not target.startswith("ct2_flash.") or target == "ct2_flash":
                continue
            destination = part_of(target)
            if LAYER_OF[destination] > LAYER_OF[source]:
                upward.append(f"{module}:{line} imports {target}")
            if destination != source:
                private += [f"{module}:{line} imports {target}.{name}" for name in names if name.startswith("_")]
    assert not upward, upward
    assert not private, private


def test_every_module_is_listed_in_the_layout_doc():
    layout = open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8").read()
    missing = []
    for path, _module in package_files():
        relative = os.path.relpath(path, ROOT).replace(os.sep, "/")
        folder = os.path.dirname(relative) + "/"
        if os.path.basename(relative) == "__init__.py":
            continue
        if f"`{relative}`" not in layout and f"`{folder}`" not in layout:
            missing.append(relative)
    assert not missing, missing


def listed_modules(docstring: str) -> set:
    """The modules a package docstring names: the ````name````s before the colon of a bullet
    (``- ``a``, ``b``: what they do``) and those of a paragraph that starts with ``Modules:``."""
    listed = set()
    for paragraph in docstring.split("\n\n"):
        if paragraph.strip().startswith("Modules:"):
            listed |= set(re.findall(r"``(\w+)``", paragraph))
        for line in paragraph.splitlines():
            bullet = re.match(r"- ((?:``\w+``(?:, )?)+):", line.strip())
            if bullet:
                listed |= set(re.findall(r"``(\w+)``", bullet.group(1)))
    return listed


def test_each_package_docstring_lists_its_modules():
    """Each folder's ``__init__.py`` says what the folder offers and names every module in it,
    and names no module that is not there (the layout doc is checked above)."""
    wrong = {}
    for directory, _, files in os.walk(PACKAGE):
        modules = {name[:-3] for name in files if name.endswith(".py") and not name.startswith("__")}
        if "__pycache__" in directory or directory == PACKAGE or not modules:
            continue
        with open(os.path.join(directory, "__init__.py"), encoding="utf-8") as stream:
            docstring = ast.get_docstring(ast.parse(stream.read())) or ""
        listed = listed_modules(docstring)
        if listed != modules:
            wrong[os.path.relpath(directory, ROOT)] = {"unlisted": modules - listed, "not a module": listed - modules}
    assert not wrong, wrong


def test_every_module_lives_in_a_folder_of_a_layer():
    """The package's top level holds only ``__init__.py``; every folder with Python files is a
    subpackage (an ``__init__.py``, so that installing finds it) named in ``LAYERS``, and every
    folder named there exists."""
    top = sorted(name for name in os.listdir(PACKAGE) if name.endswith(".py"))
    assert top == ["__init__.py"], top
    folders = set()
    for directory, _, files in os.walk(PACKAGE):
        if "__pycache__" in directory or not any(name.endswith(".py") for name in files):
            continue
        relative = os.path.relpath(directory, PACKAGE)
        if relative == ".":
            continue
        assert "__init__.py" in files, f"ct2_flash/{relative} has Python files but no __init__.py"
        folders.add(relative.split(os.sep)[0])
    assert folders == set(LAYER_OF) - {"__init__"}, folders ^ (set(LAYER_OF) - {"__init__"})


def test_the_package_finds_its_data_files():
    """Paths the package builds from its own location (a module moved to another folder must
    move its path with it)."""
    from ct2_flash.adapter.audio import SAMPLE_AUDIO
    from ct2_flash.benchmark.scripts import TEST_CLIPS
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS
    from ct2_flash.loop.row_scores import GRAPH_FILE

    assert os.path.isfile(SAMPLE_AUDIO) and os.path.isfile(GRAPH_FILE)
    assert os.path.isfile(os.path.join(TEST_CLIPS, "long_multi_voice.ogg"))  # the bench scripts' clips
    assert os.path.isfile(os.path.join(SHIPPED_DRAFTERS, "tiny.en", "drafter.json"))


def test_no_function_runs_over_80_lines():
    """A function a reader can hold at once: at most 80 lines of code (its docstring aside)."""
    long = []
    for path, module in package_files():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                doc = node.body[0]
                if isinstance(doc, ast.Expr) and isinstance(getattr(doc, "value", None), ast.Constant):
                    lines -= doc.end_lineno - doc.lineno + 1
                if lines > 80:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert not long, long
