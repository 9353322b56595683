"""Training metrics: the loop's console lines (`TrainLog`), ``WORKDIR/metrics.jsonl`` and
TensorBoard event files.

The event files are written with the protocol buffers and record writer of the
``tensorboard`` package alone, not TensorFlow's ``tf.summary`` (whose import costs seconds
and gigabytes) nor flax.metrics.tensorboard (which imports TensorFlow): a record is the
serialized ``Event`` framed by its length and CRCs, exactly what ``tensorboard --logdir``
reads.

A run resumed from a checkpoint at step M trains the steps after M again: their records
(logged before the interruption) are dropped from metrics.jsonl and the earlier event files,
and the new event file opens with TensorBoard's restart mark (see `MetricWriter`), so that
TensorBoard shows each step once, with the values of the run that trained it last.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from typing import Any

from absl import logging
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from transformer.training import rdrop, steps


class EventWriter:
    """Scalars to a new TensorBoard event file in ``logdir``, which opens with a restart mark:
    ``SessionLog(status=START)`` at ``start_step + 1``."""

    def __init__(self, logdir: str, start_step: int = 0):
        os.makedirs(logdir, exist_ok=True)
        # The name TensorBoard looks for: events.out.tfevents.<time>.<host>[.<pid>]; a second
        # writer of this process within the same second must not truncate the first's file.
        base = f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}'
        name, count = base, 0
        while os.path.exists(os.path.join(logdir, name)):
            count += 1
            name = f'{base}.{count}'
        self.path = os.path.join(logdir, name)
        self._writer = RecordWriter(open(self.path, 'wb'))  # noqa: SIM115
        self._write(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))
        # TensorBoard's Python loader drops what it has read at steps >= this mark's step
        # (event_accumulator._CheckForRestartAndMaybePurge): a TensorBoard left running over
        # the interruption forgets the steps trained again.
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._write(event_pb2.Event(wall_time=time.time(), step=start_step + 1, session_log=start))
        self._writer.flush()

    def _write(self, event: event_pb2.Event) -> None:
        self._writer.write(event.SerializeToString())

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        summary = summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()
            ]
        )
        self._write(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _records(data: bytes) -> Iterator[tuple[bytes, event_pb2.Event]]:
    """(record bytes, event) of each whole record of an event file (a length, its CRC, the
    serialized event, its CRC); stops at a record cut short by a killed process."""
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack('<Q', data[offset : offset + 8])
        end = offset + 12 + length + 4
        if end > len(data):
            return
        try:
            event = event_pb2.Event.FromString(data[offset + 12 : end - 4])
        except DecodeError:
            return
        yield data[offset:end], event
        offset = end


def read_scalars(path: str) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every scalar in an event file (for tests and quick looks)."""
    with open(path, 'rb') as f:
        data = f.read()
    return [
        (event.step, v.tag, v.simple_value)
        for _, event in _records(data)
        for v in event.summary.value
    ]


def _drop_events_after(logdir: str, step: int) -> None:
    """Rewrites each event file in ``logdir`` without its events after ``step`` and without
    the restart marks of earlier resumes (their files hold no later step any more), keeping
    the whole records before any that a killed process cut short."""
    if not os.path.isdir(logdir):
        return
    for name in sorted(os.listdir(logdir)):
        path = os.path.join(logdir, name)
        if 'tfevents' not in name or not os.path.isfile(path):  # what TensorBoard reads
            continue
        with open(path, 'rb') as f:
            data = f.read()
        kept = [
            record
            for record, event in _records(data)
            if event.step <= step and not event.HasField('session_log')
        ]
        if sum(map(len, kept)) < len(data):
            temporary = os.path.join(logdir, '.trimmed.tmp')  # no 'tfevents': TensorBoard skips it
            with open(temporary, 'wb') as f:
                f.write(b''.join(kept))
            os.replace(temporary, path)


class MetricWriter:
    """Metrics to ``metrics.jsonl`` and TensorBoard event files (process 0 only)."""

    def __init__(self, jsonl_path: str, tensorboard_dir: str, enabled: bool, start_step: int = 0):
        """``start_step``: the step this run starts from. The records of later steps, which
        an interrupted run wrote and this one trains again, are dropped from the jsonl file
        and from the earlier event files (else a replayed step was in them twice).

        Both of TensorBoard's ways to forget replayed steps are used, since each of its
        loaders honours only one: the earlier event files are rewritten without them, which
        every reader of the files sees (TensorBoard's Rust data server ignores restart marks;
        it drops a tag's points from a step on only once that tag is logged at it again), and
        the new file opens with the restart mark (`EventWriter`) that makes a Python loader
        which read the old files before the resume (a TensorBoard left running) drop them.
        """
        self.enabled = enabled
        if not enabled:
            return
        os.makedirs(os.path.dirname(jsonl_path) or '.', exist_ok=True)
        _drop_after(jsonl_path, start_step)
        _drop_events_after(tensorboard_dir, start_step)
        self._jsonl = open(jsonl_path, 'a')  # noqa: SIM115
        self._events = EventWriter(tensorboard_dir, start_step)

    def write(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        record = {'step': step, 'split': split, **{k: float(v) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(record) + '\n')
        self._jsonl.flush()
        self._events.scalars(step, {f'{split}/{k}': v for k, v in metrics.items()})

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._events.close()


def _drop_after(jsonl_path: str, step: int) -> None:
    """Keeps the records of ``jsonl_path`` up to ``step`` (and any line that is no record)."""
    if not os.path.exists(jsonl_path):
        return
    with open(jsonl_path) as f:
        lines = f.readlines()

    def later(line: str) -> bool:
        try:
            return json.loads(line).get('step', 0) > step
        except (ValueError, AttributeError, TypeError):
            return False

    kept = [line for line in lines if not later(line)]
    if len(kept) < len(lines):
        with open(jsonl_path + '.tmp', 'w') as f:
            f.writelines(kept)
        os.replace(jsonl_path + '.tmp', jsonl_path)


def _format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{secs:02d}s'


class TrainLog:
    """Sums of the steps since the last console line, turned into per-token metrics."""

    def __init__(self, run: Any, step: int):  # a transformer.training.run_setup.Run
        self._run = run
        self._sums: dict[str, float] = {}
        self._since_time, self._since_step = time.time(), step
        self._since_wait = 0.0
        self._pairs: dict[str, int] = {}  # per corpus of data.mix

    def add(self, sums: Mapping[str, Any], pairs: Mapping[str, int] | None = None) -> None:
        for key in (*steps.SUM_KEYS, 'source_tokens', rdrop.KL_KEY, steps.Z_LOSS_KEY):
            if key in sums:  # R-Drop's KL and the z-loss only when they are on
                self._sums[key] = self._sums.get(key, 0.0) + sums[key]
        for name, count in (pairs or {}).items():
            self._pairs[name] = self._pairs.get(name, 0) + count

    def flush(self, step: int, last: Mapping[str, Any], wait_s: float) -> dict[str, float]:
        """Metrics since the last flush, printed once.

        Args:
          step: the step just taken.
          last: that step's sums (gradient norm, learning rate).
          wait_s: the loop's total time waiting for data so far.
        """
        run, tc = self._run, self._run.config.train
        elapsed = max(time.time() - self._since_time, 1e-9)
        metrics = steps.summarize(
            {**self._sums, 'grad_norm': last['grad_norm'], 'learning_rate': last['learning_rate']},
            run.tokenizer.vocab_size,
            tc.label_smoothing,
        )
        metrics['steps_per_s'] = (step - self._since_step) / elapsed
        tokens = float(self._sums['tokens']) + float(self._sums['source_tokens'])
        metrics['tokens_per_s'] = tokens / elapsed
        metrics['data_wait'] = (wait_s - self._since_wait) / elapsed
        eta = (tc.num_steps - step) / max(metrics['steps_per_s'], 1e-9)
        kl, z_loss = metrics.get(rdrop.KL_KEY), metrics.get(steps.Z_LOSS_KEY)
        extra = ('' if kl is None else f'  rdrop kl {kl:.4f}') + (
            '' if z_loss is None else f'  z-loss {z_loss:.2e}'
        )
        metrics |= {f'pairs/{name}': count for name, count in self._pairs.items()}
        total = max(sum(self._pairs.values()), 1)
        shares = ''.join(f'  {n} {100 * c / total:.0f}%' for n, c in self._pairs.items())
        logging.info(
            'step %d/%d  loss %.4f  nll %.4f%s  acc %.3f  lr %.3g  %.2f steps/s  '
            '%s tokens/s  data wait %.0f%%%s  ETA %s',
            step,
            tc.num_steps,
            metrics['loss'],
            metrics['nll'],
            extra,
            metrics['accuracy'],
            metrics['learning_rate'],
            metrics['steps_per_s'],
            f'{metrics["tokens_per_s"]:,.0f}',
            100 * metrics['data_wait'],
            shares,
            _format_duration(eta),
        )
        self._sums, self._pairs = {}, {}
        self._since_time, self._since_step, self._since_wait = time.time(), step, wait_s
        return metrics
