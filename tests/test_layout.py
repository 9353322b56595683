"""The package's layout: imports go down the layers, never up or in a circle; modules and
functions stay short enough to read (the exceptions are listed, with why).

Layers, from the ground up (a module may import its own package and any lower layer):

    0  tokens, multihost, lock, backends/       leaves: ids, process-0 decisions, devices
    1  model/, data/                            the network; text to batches
    2  schema                                   the config's typed sections and their rules
    3  configs/, rundir                         experiments; the run directory
    4  checkpoint/                              checkpoints on disk
    5  decoding/                                searches over the model, text in and out
    6  evaluation/                              BLEU, decode-and-score
    7  training/                                steps, devices, checkpoints policy, the loop
    8  commands/                                train, evaluate, translate, visualize, export;
                                                their console and help
    9  api                                      the commands' work from Python
    The names trainer, evaluate, translate, visualize and export at the top are the commands'
    modules under their earlier paths (``python -m transformer.evaluate``).
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parents[1] / 'transformer'
LAYERS = {
    'tokens': 0,
    'multihost': 0,
    'lock': 0,
    'files': 0,
    'backends': 0,
    'model': 1,
    'data': 1,
    'schema': 2,
    'configs': 3,
    'rundir': 3,
    'checkpoint': 4,
    'decoding': 5,
    'evaluation': 6,
    'training': 7,
    'commands': 8,
    'trainer': 9,
    'evaluate': 9,
    'translate': 9,
    'visualize': 9,
    'export': 9,
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
    ('training/loop.py', '_setup'): 61,
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
