"""The package's layers: every import inside ct2_flash points down (or stays in its layer),
function-local imports included, and no module reaches for another layer's private names."""

import ast
import os

import ct2_flash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bottom to top. A module may import from its own layer or any layer below it.
LAYERS = [
    ("engine", "stock"),  # the CTranslate2 runtimes (patched here, stock in a worker) and model files
    ("drafting",),  # drafters: interface, files, ONNX round, PyTorch network
    ("runtime",),  # target sequence, logit rules, acceptance, the loop
    (
        "audio",
        "routing",
        "engines",
        "redecodes",
        "thread_split",
        "speculative_whisper",
        "whisper_model",
        "streaming",
        "dropin",
        "run_program",
    ),  # the faster-whisper adapter (thread_split times the loop's pass with runtime.clock)
    ("validation",),  # reference drafters, exactness comparisons, fuzzing
    ("benchmark", "train", "converters"),
    ("cli", "outputs", "collection", "__init__"),  # the command line, the transcript files it writes, whole collections
]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}


def package_files():
    for folder, package in (
        (os.path.join(ROOT, "ct2_flash"), "ct2_flash"),
        (os.path.join(ROOT, "converters"), "ct2_flash.converters"),
    ):
        for directory, _, files in os.walk(folder):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    relative = os.path.relpath(path, folder)[:-3].replace(os.sep, ".")
                    yield path, f"{package}.{relative}".replace(".__init__", "") if relative != "__init__" else package


def part_of(module: str) -> str:
    """ct2_flash.runtime.decoding -> runtime; ct2_flash.whisper_model -> whisper_model."""
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
    for path, module in package_files():
        relative = os.path.relpath(path, ROOT).replace(os.sep, "/")
        folder = os.path.dirname(relative) + "/"
        if os.path.basename(relative) == "__init__.py":
            continue
        if f"`{relative}`" not in layout and f"`{folder}`" not in layout:
            missing.append(relative)
    assert not missing, missing


def test_the_package_imports_no_top_level_converters():
    import ct2_flash.converters as converters

    assert converters.__name__ == "ct2_flash.converters"
    assert os.path.dirname(converters.__file__) == os.path.join(ROOT, "converters")
    assert ct2_flash.__file__.startswith(os.path.join(ROOT, "ct2_flash"))
