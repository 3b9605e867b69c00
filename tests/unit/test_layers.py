"""The layer rule (docs/architecture.md), read from the code's own imports (ast, no import runs):

  front     posttrain.cli, posttrain.commands            the `posttrain` command
  engines   posttrain.controller, .local, .evaluation    each imports only the layers below, never another engine
  services  S3 on one machine, task-app client, model zoo, the CLI's shared helpers
  base      posttrain.api, errors, inputs, toml_locate, hardware, plotting, localhost, reaper, storage

A module imports only its own layer or the ones below; the base imports nothing above it. The images'
packages (posttrain_trainer, posttrain_rollout) import only posttrain's base; posttrain imports neither of
them (one lazy exception, listed below with its reason). No module imports a private `_name` of another
package."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"posttrain": REPO / "operator", "posttrain_trainer": REPO / "trainer_image",
         "posttrain_rollout": REPO / "rollout_image"}  # fmt: skip

BASE, SERVICES, ENGINES, FRONT = 0, 1, 2, 3
LAYERS: dict[str, int] = {
    "posttrain": BASE,  # the package's __init__ (__version__)
    "posttrain.api": BASE,
    "posttrain.errors": BASE,
    "posttrain.inputs": BASE,
    "posttrain.toml_locate": BASE,
    "posttrain.hardware": BASE,
    "posttrain.plotting": BASE,
    "posttrain.localhost": BASE,
    "posttrain.reaper": BASE,
    "posttrain.storage": BASE,
    "posttrain.taskapp_client": SERVICES,
    "posttrain.storage_policy": SERVICES,
    "posttrain.minio_tenants": SERVICES,
    "posttrain.s3server": SERVICES,
    "posttrain.modelzoo": SERVICES,
    "posttrain.hub": SERVICES,
    "posttrain.dataset_upload": SERVICES,
    "posttrain.kubeaccess": SERVICES,
    "posttrain.envfiles": SERVICES,
    "posttrain.jobs_view": SERVICES,
    "posttrain.controller": ENGINES,
    "posttrain.local": ENGINES,
    "posttrain.evaluation": ENGINES,
    "posttrain.cli": FRONT,
    "posttrain.commands": FRONT,
}
# posttrain -> the trainer's package, each with its reason. The local backend merges a LoRA result with
# the trainer's own loader before it serves it (`posttrain eval` on this machine needs the [local] extra,
# which installs the trainer), imported inside the function so that the base install never loads torch.
TRAINER_IMPORTS_ALLOWED = {("posttrain.local.serving", "posttrain_trainer.modeling")}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (a submodule when `from pkg import submodule`)
    names: tuple[str, ...]  # what `from target import ...` takes
    line: int
    nested: bool  # inside a function


def module_names() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, root in ROOTS.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = module_names()


def imports_of(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nested_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                    for n in ast.walk(f)}  # fmt: skip
    out = []
    for node in ast.walk(tree):
        nested = id(node) in nested_nodes
        if isinstance(node, ast.Import):
            out += [Import(module, a.name, (), node.lineno, nested) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:  # `from posttrain import storage`: the submodule is the target
                    out.append(Import(module, sub, (), node.lineno, nested))
                else:
                    out.append(Import(module, target, (alias.name,), node.lineno, nested))
    return out


IMPORTS = [imp for module, path in MODULES.items() for imp in imports_of(module, path)]


def unit(module: str) -> str:
    """The layer entry a module belongs to: posttrain.controller.render.trainer -> posttrain.controller."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "posttrain" and len(parts) > 1 else parts[0]


def package(module: str) -> str:
    """The package a module is part of (a loose module's is `posttrain`), for the private-name rule."""
    top = unit(module)
    return top if top in MODULES and MODULES[top].name == "__init__.py" else module.split(".")[0]


def where(imp: Import) -> str:
    return f"{MODULES[imp.source].relative_to(REPO)}:{imp.line} imports {imp.target}"


def test_every_module_of_posttrain_has_a_layer() -> None:
    missing = sorted({unit(m) for m in MODULES if m.split(".")[0] == "posttrain"} - set(LAYERS))
    assert not missing, f"give each a layer in LAYERS (and docs/architecture.md): {missing}"


def test_a_module_imports_only_its_layer_or_the_ones_below() -> None:
    wrong = []
    for imp in IMPORTS:
        if imp.source.split(".")[0] != "posttrain" or imp.target.split(".")[0] != "posttrain":
            continue
        src, dst = unit(imp.source), unit(imp.target)
        if src == dst:
            continue
        if LAYERS[dst] > LAYERS[src] or (LAYERS[dst] == LAYERS[src] == ENGINES):
            wrong.append(f"{where(imp)} ({src}: layer {LAYERS[src]}, {dst}: layer {LAYERS[dst]})")
    assert not wrong, "\n".join(wrong)


def test_the_images_packages_import_only_posttrains_base() -> None:
    wrong = [where(imp) for imp in IMPORTS if imp.source.split(".")[0] in ("posttrain_trainer", "posttrain_rollout")
             and imp.target.split(".")[0] == "posttrain" and LAYERS[unit(imp.target)] != BASE]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_posttrain_imports_the_trainer_and_rollout_packages_only_where_listed() -> None:
    found = {(imp.source, imp.target): imp for imp in IMPORTS
             if imp.source.split(".")[0] == "posttrain" and imp.target.split(".")[0] in ROOTS
             and imp.target.split(".")[0] != "posttrain"}  # fmt: skip
    assert set(found) <= TRAINER_IMPORTS_ALLOWED, "\n".join(where(i) for k, i in found.items()
                                                            if k not in TRAINER_IMPORTS_ALLOWED)  # fmt: skip
    assert all(imp.nested for imp in found.values()), "the base install must not load torch at import"


def test_no_private_name_is_imported_across_packages() -> None:
    wrong = []
    for imp in IMPORTS:
        if imp.target not in MODULES or package(imp.source) == package(imp.target):
            continue
        private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        if private or any(p.startswith("_") and not p.startswith("__") for p in imp.target.split(".")):
            wrong.append(f"{where(imp)}: {private or imp.target}")
    assert not wrong, "\n".join(wrong)


def test_the_rules_see_real_imports() -> None:
    """The parser finds what is there (a rule over an empty graph would pass for nothing)."""
    pairs = {(unit(i.source), unit(i.target)) for i in IMPORTS}
    assert ("posttrain.controller", "posttrain.api") in pairs and ("posttrain.commands", "posttrain.local") in pairs
    assert ("posttrain_trainer", "posttrain.api") in pairs
    assert ("posttrain.local.serving", "posttrain_trainer.modeling") in {(i.source, i.target) for i in IMPORTS}
    assert package("posttrain.controller.render.trainer") == "posttrain.controller"
    assert package("posttrain.hardware") == "posttrain"
