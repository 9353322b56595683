"""Metrics files after a resume: TensorBoard, read back as TensorBoard reads the event files,
shows each step once, with the values of the run that trained it last."""

import os

from tensorboard.backend.event_processing import event_accumulator

from transformer.training import metrics


def _scalars(accumulator, tag):
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def _log(writer, steps, offset=0.0):
    for step in steps:
        writer.write(step, 'train', {'loss': offset + step})
        if step % 2 == 0:
            writer.write(step, 'validation', {'loss': offset + 10 * step})


def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path):
    """Steps 1-4 logged, then killed mid-record; resumed from the checkpoint of step 2, the
    run logs steps 3 and 4 again with other values."""
    jsonl, logdir = str(tmp_path / 'metrics.jsonl'), tmp_path / 'tensorboard'
    writer = metrics.MetricWriter(jsonl, str(logdir), enabled=True)
    _log(writer, [1, 2, 3, 4])
    writer.close()
    (first,) = os.listdir(logdir)
    record = (logdir / first).read_bytes()[-40:]
    with open(logdir / first, 'ab') as f:  # a record cut short by the kill
        f.write(record[:25])
    running = event_accumulator.EventAccumulator(str(logdir))  # a TensorBoard left open
    running.Reload()
    assert _scalars(running, 'train/loss') == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]

    writer = metrics.MetricWriter(jsonl, str(logdir), enabled=True, start_step=2)
    _log(writer, [3, 4], offset=100.0)
    writer.close()
    assert len(os.listdir(logdir)) == 2  # a new file; the first one is not overwritten
    assert max(step for step, _, _ in metrics.read_scalars(str(logdir / first))) == 2

    running.Reload()
    fresh = event_accumulator.EventAccumulator(str(logdir))  # TensorBoard started afterwards
    fresh.Reload()
    for accumulator in (running, fresh):
        assert _scalars(accumulator, 'train/loss') == [(1, 1), (2, 2), (3, 103), (4, 104)]
        assert _scalars(accumulator, 'validation/loss') == [(2, 20), (4, 140)]

    # A second resume, from an earlier checkpoint than the first: each file keeps steps <= 1.
    writer = metrics.MetricWriter(jsonl, str(logdir), enabled=True, start_step=1)
    _log(writer, [2, 3], offset=200.0)
    writer.close()
    fresh = event_accumulator.EventAccumulator(str(logdir))
    fresh.Reload()
    assert _scalars(fresh, 'train/loss') == [(1, 1), (2, 202), (3, 203)]
    assert _scalars(fresh, 'validation/loss') == [(2, 220)]
