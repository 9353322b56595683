"""The package's layout: imports go down the layers, never up or in a circle; each subpackage
names its public API in its __init__'s ``__all__`` and is imported through it from
elsewhere; modules and functions stay short enough to read (the exceptions are listed, with
why).

Layers, from the ground up (a module may import its own package and any lower layer):

    0  tokens, multihost, lock, files, fields,  leaves: ids, process-0 decisions, the lock,
       formats, backends/                       disk errors, config fields and their rules,
                                                what each export format writes, devices
    1  model/, data/                            the network; text to batches
    2  schema, interop/                         the config's typed sections and their rules;
                                                the pretrained families (MarianMT): their
                                                directories, vocabularies, exports
    3  configs/, rundir                         experiments; the run directory
    4  checkpoint/, run_changes                 checkpoints on disk; what a resume may change
    5  decoding/                                searches over the model, text in and out
    6  evaluation/                              BLEU, decode-and-score
    7  training/                                steps, devices, checkpoints policy, the loop
    8  commands/                                train, evaluate, translate, score, visualize,
                                                export, convert, prepare;
                                                their console and help
    9  api                                      the commands' work from Python
    The names evaluate, translate, score, visualize, export, convert and prepare at the top are the
    commands' modules under their earlier paths (``python -m transformer.evaluate``).
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parents[1] / 'transformer'
LAYERS = {
    'tokens': 0,
    'multihost': 0,
    'lock': 0,
    'files': 0,
    'fields': 0,
    'formats': 0,
    'backends': 0,
    'model': 1,
    'data': 1,
    'schema': 2,
    'interop': 2,
    'configs': 3,
    'rundir': 3,
    'run_changes': 4,
    'checkpoint': 4,
    'decoding': 5,
    'evaluation': 6,
    'training': 7,
    'commands': 8,
    'evaluate': 9,
    'translate': 9,
    'score': 9,
    'visualize': 9,
    'export': 9,
    'convert': 9,
    'prepare': 9,
    'api': 9,
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Longer functions that stay whole, with their length today (they may shrink, not grow):
LONG_FUNCTIONS = {
    # The synthetic language's grammar, one rule after another.
    ('data/synthetic.py', 'translate'): 91,
    # The searches' loops: state, step and stopping rule read best together.
    ('decoding/beam.py', '_beam_search'): 128,
    ('decoding/beam.py', 'decode_step'): 61,
    ('decoding/greedy.py', 'greedy_search'): 70,
    # Attention's forward pass: projections, the cache, the two implementations.
    ('model/attention.py', '__call__'): 100,
    ('model/transformer.py', 'decode'): 69,
    # Constructors that check their arguments before building.
    ('data/packing.py', '__init__'): 61,
    ('training/parallel.py', '__init__'): 61,
    # Command flows: load, decode or train, write; the steps are the sentences of the story.
    ('decoding/translation.py', 'translate_lines'): 67,
    ('commands/evaluate.py', 'run'): 88,
    ('training/run_setup.py', '_setup'): 61,
    ('training/loop.py', '_train'): 87,
    ('commands/translate.py', 'cli'): 71,
}


def _modules() -> dict[str, pathlib.Path]:
    return {
        '.'.join(path.relative_to(PACKAGE).with_suffix('').parts): path
        for path in sorted(PACKAGE.rglob('*.py'))
    }


def _imports(path: pathlib.Path, modules) -> set[str]:
    """The transformer modules ``path`` imports, as keys of ``modules`` (``pkg.__init__`` for
    a name a package hands on)."""

    def resolve(name: str) -> str:
        return name if name in modules else f'{name}.__init__'

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != 'transformer' and not node.module.startswith('transformer.'):
                continue
            base = node.module[len('transformer.') :] if '.' in node.module else ''
            for alias in node.names:
                dotted = f'{base}.{alias.name}' if base else alias.name
                found.add(dotted if dotted in modules else resolve(base or dotted))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith('transformer.'):
                    found.add(resolve(alias.name[len('transformer.') :]))
    return found


def _layer(module: str) -> int:
    return LAYERS[module.split('.')[0]]


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _modules() if m != '__init__' and m.split('.')[0] not in LAYERS)
    assert not unplaced, f'give these modules a layer in LAYERS: {unplaced}'


def test_imports_go_down_the_layers():
    upward = []
    modules = _modules()
    for module, path in modules.items():
        if module == '__init__':
            continue
        package = module.split('.')[0]
        for target in _imports(path, modules):
            same_package = target.split('.')[0] == package
            if not same_package and _layer(target) >= _layer(module):
                upward.append(f'{module} -> {target}')
    assert not upward, upward


def test_no_import_circle():
    modules = _modules()
    graph = {
        module: {t for t in _imports(path, modules) if t in modules and t != module}
        for module, path in modules.items()
    }
    state: dict[str, int] = {}
    circles = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, circles


def test_modules_and_functions_stay_short():
    long_modules, long_functions = [], []
    for module, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append((module, len(text.splitlines())))
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                allowed = LONG_FUNCTIONS.get((rel, node.name), MAX_FUNCTION_LINES)
                if lines > allowed:
                    long_functions.append((rel, node.name, lines, allowed))
    assert not long_modules, long_modules
    assert not long_functions, long_functions


# --- Public APIs: each subpackage names its API in its __init__'s __all__ --------------------

REPO = PACKAGE.parent
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob('*/__init__.py'))
_STAGES = 'times the data pipeline stage by stage: the modules outside its API are what it measures'
# Imports of a module outside its subpackage's API, by (importing file, module): each with why.
PRIVATE_IMPORTS = {
    ('benchmarks/data_pipeline.py', 'transformer.data.packing'): _STAGES,
    ('benchmarks/data_pipeline.py', 'transformer.data.tokenized'): _STAGES,
    ('benchmarks/data_pipeline.py', 'transformer.data.tokenizer'): _STAGES,
}


def _public_api(package: str) -> tuple[str | None, list[str] | None, set[str]]:
    """A subpackage's __init__: its docstring, its ``__all__`` (None without one) and the
    names it binds at the top."""
    tree = ast.parse((PACKAGE / package / '__init__.py').read_text())
    names, bound = None, set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split('.')[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            targets = {t.id for t in node.targets if isinstance(t, ast.Name)}
            bound |= targets
            if '__all__' in targets:
                names = list(ast.literal_eval(node.value))
    return ast.get_docstring(tree), names, bound


def _callers() -> list[pathlib.Path]:
    return [
        *sorted(PACKAGE.rglob('*.py')),
        *sorted((REPO / 'benchmarks').glob('*.py')),
        REPO / 'train.py',
    ]


def _private_imports(path: pathlib.Path, apis: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(importing file, imported module) for each import in ``path`` of another
    subpackage's module other than through its public API (``apis``: package -> __all__)."""
    rel = str(path.relative_to(REPO))
    parts = path.relative_to(PACKAGE).parts if path.is_relative_to(PACKAGE) else ()
    own = parts[0] if len(parts) > 1 else None
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            dotted = [a.name.split('.') for a in node.names]
            found += [(rel, '.'.join(d)) for d in dotted if len(d) > 2 and d[0] == 'transformer']
            continue
        if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
            continue
        module = node.module.split('.')
        if module[0] != 'transformer' or len(module) < 2 or module[1] not in apis:
            continue
        if len(module) > 2:
            found.append((rel, node.module))
        else:
            api = apis[module[1]]
            found += [(rel, f'{node.module}.{a.name}') for a in node.names if a.name not in api]
    return [(rel, module) for rel, module in found if module.split('.')[1] != own]


def test_every_subpackage_names_its_public_api():
    """Each subpackage's __init__ says what the layer does and names its API in __all__."""
    unnamed = []
    for package in SUBPACKAGES:
        docstring, names, _ = _public_api(package)
        if not docstring or names is None:
            unnamed.append(package)
    assert not unnamed, f'give these an __init__ docstring and __all__: {unnamed}'


def test_every_name_in_a_public_api_exists():
    """Every name in a public API's __all__ is bound in its __init__ or is one of its modules."""
    missing = []
    for package in SUBPACKAGES:
        _, names, bound = _public_api(package)
        modules = {p.stem for p in (PACKAGE / package).glob('*.py')}
        modules |= {p.parent.name for p in (PACKAGE / package).glob('*/__init__.py')}
        missing += [f'{package}.{n}' for n in names or () if n not in bound | modules]
    assert not missing, missing


def test_callers_outside_a_subpackage_import_its_public_api():
    """transformer/, benchmarks/ and train.py import another subpackage only through its public API:
    ``from transformer import training`` or ``from transformer.training import X`` with X in
    its __all__; never one of its modules (the exceptions are listed, with why)."""
    apis = {package: _public_api(package)[1] or [] for package in SUBPACKAGES}
    behind = [found for path in _callers() for found in _private_imports(path, apis)]
    unlisted = sorted(set(behind) - set(PRIVATE_IMPORTS))
    assert not unlisted, f'import these through the public API (__all__): {unlisted}'
    stale = sorted(set(PRIVATE_IMPORTS) - set(behind))
    assert not stale, f'no longer imported outside the API; drop from PRIVATE_IMPORTS: {stale}'


# --- The model's functional interface: Flax's module API stays inside transformer/model/ ----

# Files outside transformer/model/ that may import flax.linen, each with why.
LINEN_OUTSIDE_THE_MODEL = {
    'benchmarks/decode_peers.py': "runs flax's examples/wmt model, a Linen program, as a peer",
}


def _imports_linen(path: pathlib.Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            if any(a.name == 'flax.linen' or a.name.startswith('flax.linen.') for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == 'flax' and any(a.name == 'linen' for a in node.names):
                return True
            if node.module == 'flax.linen' or node.module.startswith('flax.linen.'):
                return True
    return False


def test_no_module_outside_the_model_imports_flax_linen():
    """Training, decoding, checkpoints, the API, backends and benchmarks call the model through
    transformer/model's functions (functional.py), so the Flax API it is written in is one
    package's business (docs/nnx.md)."""
    model = PACKAGE / 'model'
    outside = [p for p in _callers() if not p.is_relative_to(model)]
    found = {str(p.relative_to(REPO)) for p in outside if _imports_linen(p)}
    assert found == set(LINEN_OUTSIDE_THE_MODEL), sorted(found ^ set(LINEN_OUTSIDE_THE_MODEL))
    assert _imports_linen(model / 'transformer.py')  # the check sees an import when there is one
