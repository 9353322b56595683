"""The background input thread: batches in order with their data position, and an error in
the producer reaches the loop without hanging it, whether the loop reads on or stops."""

import threading
import time

import pytest

from transformer.data.prefetch import Prefetcher


class _Batches:
    """Yields 0, 1, ...; raises on batch ``fail_at``; get_state() is the next batch's index."""

    def __init__(self, fail_at: int):
        self.i = 0
        self.fail_at = fail_at
        self.raised = threading.Event()

    def __next__(self):
        if self.i == self.fail_at:
            self.raised.set()
            raise ValueError(f'batch {self.i} is damaged')
        self.i += 1
        return self.i - 1

    def get_state(self):
        return {'next': self.i}


def _full_then_raising(depth: int = 2) -> tuple[Prefetcher, _Batches]:
    """A prefetcher whose queue is full (``depth`` batches) and whose producer has raised."""
    batches = _Batches(fail_at=depth)
    prefetcher = Prefetcher(batches, put=lambda b: b, depth=depth)
    assert batches.raised.wait(5), 'the producer never reached the damaged batch'
    time.sleep(0.2)  # the producer is now waiting to hand its error over
    return prefetcher, batches


def test_close_returns_when_the_producer_raised_with_the_queue_full():
    prefetcher, _ = _full_then_raising()
    closing = threading.Thread(target=prefetcher.close, daemon=True)  # a hang fails, not hangs
    closing.start()
    closing.join(1.0)
    assert not closing.is_alive(), 'close() did not return within a second'
    assert not prefetcher._thread.is_alive()
    # The loop that stopped reading still learns of the error on its next read.
    assert next(prefetcher) == (0, {'next': 1}, {})
    assert next(prefetcher) == (1, {'next': 2}, {})
    with pytest.raises(ValueError, match='batch 2 is damaged'):
        next(prefetcher)


def test_the_loop_reads_the_batches_before_the_error_then_the_error():
    prefetcher, _ = _full_then_raising()
    try:
        assert [next(prefetcher)[0] for _ in range(2)] == [0, 1]
        with pytest.raises(ValueError, match='batch 2 is damaged'):
            next(prefetcher)
    finally:
        prefetcher.close()


class _MixedBatches(_Batches):
    """`_Batches` whose batch i held i pairs of corpus 'a' and 1 of 'b' (`last_pairs`)."""

    def __next__(self):
        batch = super().__next__()
        self.last_pairs = {'a': batch, 'b': 1}
        return batch


@pytest.mark.parametrize('depth', [0, 3])
def test_batches_come_in_order_with_the_position_and_the_pairs_after_each(depth):
    prefetcher = Prefetcher(_Batches(fail_at=-1), put=lambda b: b * 10, depth=depth)
    try:
        expected = [(10 * i, {'next': i + 1}, {}) for i in range(4)]
        assert [next(prefetcher) for _ in range(4)] == expected
    finally:
        prefetcher.close()
    prefetcher = Prefetcher(_MixedBatches(fail_at=-1), put=lambda b: b, depth=depth)
    try:
        expected = [(i, {'next': i + 1}, {'a': i, 'b': 1}) for i in range(6)]
        assert [next(prefetcher) for _ in range(6)] == expected
    finally:
        prefetcher.close()
