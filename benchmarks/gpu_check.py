r"""The project's checks on an accelerator, as one command of a few minutes.

  python benchmarks/gpu_check.py --out gpu_check --multi30k_dir ../shared/data/multi30k

Five parts, each in processes of its own (so that no process holds the GPU's memory while the
next one needs it), each skipped with ``--skip_PART``:

1. ``train_speed``: benchmarks/train_speed.py on ``--train_speed_config`` (configs/base.py) in
   ``--dtype`` (bfloat16) on random batches of the config's shape, once per attention
   implementation (einsum, fused): ms/step, MFU, XLA's temporaries.
2. ``profile``: ``--profile_steps`` more steps of the ``--profile_impl`` run traced with
   `jax.profiler`; the kernels' time from the trace's Perfetto JSON (`kernel_table`), by kind
   and the 25 longest.
2b. ``peer``: benchmarks/torch_peer.py, the same layers in PyTorch on the same shapes, so each
   row reads as ours / torch.compile from the same call (a GPU with torch only).
3. ``multi30k``: ``train.py`` with ``--multi30k_config`` for ``--multi30k_steps`` (validation
   loss every ``--multi30k_eval_every`` steps, no BLEU during training), then
   ``python -m transformer.evaluate --split validation`` on it (the config's checkpoint
   averaging, beam and alpha): validation BLEU. train.py and the evaluate command import
   sacremoses (tokenized BLEU): without it this part is skipped, saying so.
4. ``tests``: the whole test suite (``--tests``, default every test, slow ones and the long
   tier included: ``-m ''``) in
   ``--test_workers`` pytest-xdist processes; the summary names every failed test.

``--variants`` runs instead benchmarks/step_variants.py on ``--train_speed_config`` in
``--dtype``: the default step and each accelerator-dependent choice alone, timed in rounds on
the same batches, profiled, in one table (variants.md, ~4 minutes on an H100), with its
``--flags`` XLA flag sets and the PyTorch peer (``--peer``) unless ``--skip_peer``:

  python benchmarks/gpu_check.py --out gpu_variants --variants --deadline_s 510  # whole command

Writes to ``--out`` at most eight files: summary.json (every figure), summary.md (the tables),
train_speed.log, peer.log, multi30k_train.log, multi30k_evaluate.log and tests.log, or with
``--variants`` variants.log, variants.json and variants.md. Besides sacremoses,
the processes import jax, flax, optax, orbax, numpy, sentencepiece, sacrebleu, absl,
ml_collections and the project's einops and tensorboard, never TensorFlow (Multi30k is read
from its files). On CPU, in a minute or two:

  python benchmarks/gpu_check.py --out /tmp/gpu_check --train_speed_config configs/tiny.py \
      --train_speed_steps 2 --profile_steps 2 --multi30k_config configs/tiny.py \
      --multi30k_steps 20 --eval_flags=--max_examples=8 --tests tests/model/test_masks.py
  python benchmarks/gpu_check.py --out /tmp/gpu_variants --variants \
      --train_speed_config configs/tiny.py --dtype float32 --variant_flags='--steps 3 --rounds 2'
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu_report import markdown  # noqa: E402
from benchmarks.kernel_time import kernel_table, load_trace  # noqa: E402


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add('--out', required=True, help='directory of the summary and the logs (<= 8 files)')
    for part in ('train_speed', 'profile', 'peer', 'multi30k', 'tests'):
        add(f'--skip_{part}', action='store_true', help=f'skip the {part} part')
    add('--train_speed_config', default='configs/base.py')
    add('--dtype', default='bfloat16', help='model.dtype of the train_speed runs')
    add('--impls', nargs='+', default=['einsum', 'fused'], help='model.attention_impl values')
    add('--train_speed_steps', type=int, default=20, help='timed steps')
    add('--train_speed_warmup', type=int, default=3, help='untimed steps first')
    add('--train_speed_set', action='append', default=[], help='KEY=VALUE config override')
    add('--profile_impl', default='fused', help='the implementation whose run is traced')
    add('--profile_steps', type=int, default=4, help='steps traced after the timing')
    add('--peer_modes', default='compile', help="torch_peer.py modes: 'eager', 'compile'")
    add('--multi30k_config', default='configs/multi30k.py:dropout02')
    add('--multi30k_steps', type=int, default=12000, help='train.num_steps')
    add('--multi30k_dir', default=None, help='data.manual_dir: the Multi30k files')
    add('--multi30k_eval_every', type=int, default=2000, help='train.eval_every (loss only)')
    add('--multi30k_set', action='append', default=[], help='KEY=VALUE config override')
    add('--multi30k_workdir', default=None, help='run directory (default: a temporary one)')
    add('--eval_flags', default='', help='more flags for transformer.evaluate')
    add('--tests', default='', help='pytest arguments (default: the whole suite)')
    add('--test_workers', type=int, default=min(8, os.cpu_count() or 1), help='pytest -n')
    add('--variants', action='store_true', help='only the step variants table')
    add('--variant_flags', default='', help='more flags for benchmarks/step_variants.py')
    add('--timeout_s', type=int, default=540, help='limit of each process, seconds')
    add('--deadline_s', type=int, default=0, help='limit of the whole command (0: none)')
    return parser.parse_args(argv)


class Runner:
    """Runs the parts' processes from the repository root, each one's output appended to a
    log in ``out``, and says what it does as it goes."""

    def __init__(self, out: pathlib.Path, timeout_s: int, deadline_s: int = 0):
        self.out, self.timeout_s, self.start = out, timeout_s, time.time()
        self.deadline_s = deadline_s

    def left_s(self) -> float:
        """Seconds a process may still take: ``timeout_s``, or less where the deadline is near."""
        if not self.deadline_s:
            return float(self.timeout_s)
        return max(0.0, min(self.timeout_s, self.deadline_s - (time.time() - self.start)))

    def say(self, line: str) -> None:
        print(f'[gpu_check {time.time() - self.start:6.0f} s] {line}', flush=True)

    def run(self, cmd: list[str], log: str, env: dict | None = None) -> tuple[int, float]:
        """(exit code, seconds) of ``cmd``; 124 when it ran past the time limit, after which
        it and every process it started are killed (none holds the GPU on into the next)."""
        start, limit = time.time(), self.left_s()
        with open(self.out / log, 'a') as f:
            f.write(f'$ {shlex.join(cmd)}\n')
            f.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = 124
            f.write(f'# exit code {code} after {time.time() - start:.1f} s\n\n')
        return code, time.time() - start

    def tail(self, log: str) -> str:
        """The last line a process wrote to ``log`` (pytest's counts, an error)."""
        lines = (self.out / log).read_text().splitlines()
        said = [line for line in lines if line.strip() and not line.startswith(('$ ', '# exit'))]
        return said[-1].strip() if said else ''


def train_speed(args, runner: Runner, scratch: str) -> dict:
    """Part 1 and 2: one train_speed.py process per implementation; the profiled one traces."""
    impls = list(args.impls) if not args.skip_train_speed else [args.profile_impl]
    results = {}
    for impl in impls:
        out_json = os.path.join(scratch, f'train_speed_{impl}.json')
        cmd = [sys.executable, 'benchmarks/train_speed.py', f'--config={args.train_speed_config}']
        cmd += [f'--config.model.dtype={args.dtype}', f'--config.model.attention_impl={impl}']
        cmd += [f'--config.{setting}' for setting in args.train_speed_set]
        cmd += ['--data=random', f'--steps={args.train_speed_steps}', f'--out={out_json}']
        cmd += [f'--warmup={args.train_speed_warmup}']
        profiled = not args.skip_profile and impl == args.profile_impl
        if profiled:
            cmd += [f'--profile_steps={args.profile_steps}', f'--profile_dir={scratch}/trace']
        runner.say(f'train_speed {impl}{" + profile" if profiled else ""} ...')
        code, seconds = runner.run(cmd, 'train_speed.log')
        if code:
            results[impl] = {'exit_code': code, 'error': runner.tail('train_speed.log')}
            runner.say(f'train_speed {impl} failed ({code}): see train_speed.log')
            continue
        results[impl] = json.loads(pathlib.Path(out_json).read_text()) | {'wall_s': seconds}
        r = results[impl]
        temp = 'n/a' if r['temp_bytes'] is None else f'{r["temp_bytes"] / 2**20:.0f} MiB'
        runner.say(f'train_speed {impl}: {r["ms_per_step"]:.1f} ms/step, temporaries {temp}')
    kernels = None
    if not args.skip_profile and 'error' not in results.get(args.profile_impl, {'error': 1}):
        try:
            kernels = kernel_table(load_trace(f'{scratch}/trace'), args.profile_steps)
        except (OSError, ValueError, KeyError) as e:  # no trace, or one not as expected
            runner.say(f'profile: no kernel table: {e!r}')
            return {'train_speed': results, 'kernels': {'error': repr(e)}}
        top = kernels['kinds']
        runner.say('kernels: ' + ', '.join(f'{k["kind"]} {k["share"]:.0%}' for k in top))
    return {'train_speed': results, 'kernels': kernels}


def peer(args, runner: Runner, scratch: str, device: str) -> dict:
    """Part 2b: benchmarks/torch_peer.py on the train_speed config's shapes (a GPU only)."""
    if not device.startswith('gpu'):
        runner.say(f'peer: skipped: the PyTorch peer is timed on a GPU, not {device}')
        return {'error': f'not a GPU ({device})'}
    out_json = os.path.join(scratch, 'peer.json')
    cmd = [sys.executable, 'benchmarks/torch_peer.py', f'--config={args.train_speed_config}']
    cmd += [f'--set={setting}' for setting in args.train_speed_set]
    cmd += [f'--modes={args.peer_modes}', f'--out={out_json}']
    runner.say(f'peer: PyTorch ({args.peer_modes}) on the same shapes ...')
    code, seconds = runner.run(cmd, 'peer.log')
    if code or not os.path.exists(out_json):
        return {'exit_code': code, 'error': runner.tail('peer.log')}
    runner.say(f'peer: done in {seconds:.0f} s')
    return json.loads(pathlib.Path(out_json).read_text()) | {'wall_s': seconds}


def multi30k(args, runner: Runner, workdir: str) -> dict:
    """Part 3: train, then the validation BLEU of the config's evaluation settings."""
    result = {'config': args.multi30k_config, 'steps': args.multi30k_steps}
    if importlib.util.find_spec('sacremoses') is None:
        # transformer/evaluation/bleu.py imports it, and train.py imports that (validation).
        runner.say('multi30k: skipped: train.py and transformer.evaluate need sacremoses')
        return result | {'error': 'sacremoses is not installed (pip install sacremoses)'}
    cmd = [sys.executable, 'train.py', f'--config={args.multi30k_config}', f'--workdir={workdir}']
    cmd += [f'--config.train.num_steps={args.multi30k_steps}', '--config.eval.bleu_every=0']
    cmd += [f'--config.train.eval_every={args.multi30k_eval_every}']
    if args.multi30k_dir:
        cmd += [f'--config.data.manual_dir={args.multi30k_dir}']
    cmd += [f'--config.{setting}' for setting in args.multi30k_set]
    runner.say(f'multi30k: training {args.multi30k_config} for {args.multi30k_steps} steps ...')
    code, train_s = runner.run(cmd, 'multi30k_train.log')
    result['train_s'] = train_s
    if code:
        runner.say(f'multi30k training failed ({code}): see multi30k_train.log')
        return result | {'exit_code': code, 'error': runner.tail('multi30k_train.log')}
    final = json.loads(pathlib.Path(workdir, 'final_metrics.json').read_text())
    loop_s = final.get('wall_time_s') or train_s  # the training loop's own wall time
    result |= {'final_metrics': final, 'steps_per_s': final.get('steps_this_run', 0) / loop_s}
    runner.say(f'multi30k: trained in {train_s:.0f} s; evaluating on validation ...')
    output = os.path.join(workdir, 'gpu_check_validation.txt')
    cmd = [sys.executable, '-m', 'transformer.evaluate', f'--workdir={workdir}']
    cmd += ['--split=validation', f'--output={output}', *shlex.split(args.eval_flags)]
    code, eval_s = runner.run(cmd, 'multi30k_evaluate.log')
    if code:
        runner.say(f'multi30k evaluation failed ({code}): see multi30k_evaluate.log')
        return result | {'exit_code': code, 'error': runner.tail('multi30k_evaluate.log')}
    scores = json.loads(pathlib.Path(output).with_suffix('.json').read_text())
    runner.say(f'multi30k: validation tokenized BLEU {scores["tokenized_bleu"]:.2f}')
    return result | {'evaluate_s': eval_s, 'validation': scores}


def failures(log: str) -> list[str]:
    """The tests a pytest log names as failed or in error: its short summary (``-rfE``), or,
    for a run stopped before its end, the line ``-v`` gives each test as it ends
    (``[gw3] [ 12%] FAILED tests/...``)."""
    found = re.findall(r'(?:^|\] )(?:FAILED|ERROR) (tests/\S+)', log, flags=re.MULTILINE)
    return list(dict.fromkeys(found))


def tests(args, runner: Runner) -> dict:
    """Part 4: pytest; each test process allocates GPU memory as it needs it."""
    cmd = [sys.executable, '-m', 'pytest', '-v', '-rfE', '-p', 'no:cacheprovider']
    if args.test_workers > 1:
        cmd += ['-n', str(args.test_workers)]
    cmd += shlex.split(args.tests) if args.tests else ['-m', '']  # '': the long tier too
    runner.say(f'tests: {shlex.join(cmd[1:])} ...')
    code, seconds = runner.run(cmd, 'tests.log', env={'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'})
    line = runner.tail('tests.log')
    failed = failures((runner.out / 'tests.log').read_text())
    runner.say(f'tests: exit code {code} in {seconds:.0f} s: {line}')
    for name in failed:
        runner.say(f'  failed: {name}')
    return {
        'args': args.tests or '(the whole suite)',
        'exit_code': code,
        'summary': line,
        'seconds': seconds,
        'failed': failed,
    }


def variants(args, runner: Runner) -> dict:
    """The step variants table (benchmarks/step_variants.py) in a process of its own."""
    cmd = [sys.executable, 'benchmarks/step_variants.py', f'--config={args.train_speed_config}']
    cmd += [f'--set=model.dtype={args.dtype}', f'--out={runner.out}']
    cmd += [f'--set={setting}' for setting in args.train_speed_set]
    if not args.skip_peer:
        cmd += ['--peer']
    if args.deadline_s:  # a margin for this process's own summary
        cmd += [f'--deadline_s={max(1, int(runner.left_s()) - 20)}']
    cmd += shlex.split(args.variant_flags)
    runner.say('variants: building, compiling and timing every variant ...')
    code, seconds = runner.run(cmd, 'variants.log')
    if code:
        runner.say(f'variants failed ({code}): see variants.log')
        return {'exit_code': code, 'error': runner.tail('variants.log'), 'seconds': seconds}
    runner.say(f'variants: done in {seconds:.0f} s')
    report = json.loads((runner.out / 'variants.json').read_text())
    return {'seconds': seconds, 'table': (runner.out / 'variants.md').read_text()} | report


def _device() -> tuple[str, str]:
    """(device, jax version) from a process of its own: this one never holds the GPU."""
    code = (
        'import jax; d = jax.devices()[0]; print(f"{d.platform}:{d.device_kind}|{jax.__version__}")'
    )
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=REPO)
    said = done.stdout.strip().splitlines()
    return tuple(said[-1].split('|')) if done.returncode == 0 and said else ('unknown', 'unknown')


def run_parts(args, runner: Runner, scratch: str, summary: dict) -> None:
    """Parts 1-4, each unless skipped, their figures added to ``summary``."""
    if not (args.skip_train_speed and args.skip_profile):
        summary |= train_speed(args, runner, scratch)
    if not args.skip_peer:
        summary['peer'] = peer(args, runner, scratch, summary['device'])
    if not args.skip_multi30k:
        workdir = args.multi30k_workdir or os.path.join(scratch, 'multi30k')
        summary['multi30k'] = multi30k(args, runner, workdir)
    if not args.skip_tests:
        summary['tests'] = tests(args, runner)


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(out, args.timeout_s, args.deadline_s)
    device, jax_version = _device()
    runner.say(f'{device}, jax {jax_version}; writing to {out}')
    summary = {'device': device, 'jax': jax_version, 'argv': sys.argv[1:] if argv is None else argv}
    scratch = tempfile.mkdtemp(prefix='gpu-check-')
    try:
        if args.variants:
            summary['variants'] = variants(args, runner)
        else:
            run_parts(args, runner, scratch, summary)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        summary['wall_s'] = time.time() - runner.start
        (out / 'summary.json').write_text(json.dumps(summary, indent=2))
        (out / 'summary.md').write_text(markdown(summary))
    runner.say(f'done in {summary["wall_s"]:.0f} s: {out}/summary.md')
    return summary


if __name__ == '__main__':
    main()
