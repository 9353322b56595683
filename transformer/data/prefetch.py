"""Input overlap: training batches packed on a background thread and placed on the devices
ahead of the step that needs them.

The loop would otherwise pack each batch on the host while the devices wait. Each item is
(placed batch, iterator state after it, the batch's pairs per corpus of ``data.mix``), so a
checkpoint saves exactly the data position of the batches the model has seen, however far
ahead the thread has read, and the metrics count the pairs of those batches. ``wait_s`` counts the
time the loop spent waiting for data (the figure the training log reports as a fraction).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from absl import logging


class Prefetcher(Iterator[tuple[Any, dict, dict]]):
    """Iterates (put(batch), state, pairs) over ``iterator`` with ``depth`` batches ready
    ahead; ``pairs`` is the iterator's ``last_pairs`` after the batch ({} without one).

    ``depth=0`` packs and places each batch when it is asked for (no overlap), for comparison.
    """

    def __init__(self, iterator, put: Callable[[Any], Any], depth: int = 2):
        self._iterator = iterator
        self._put = put
        self.depth = depth
        self.wait_s = 0.0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = None
        if depth > 0:
            self._queue: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._fill, daemon=True, name='prefetch')
            self._thread.start()

    def _produce(self) -> tuple[Any, dict, dict]:
        batch = next(self._iterator)
        pairs = dict(getattr(self._iterator, 'last_pairs', {}))
        return self._put(batch), self._iterator.get_state(), pairs

    def _offer(self, item) -> bool:
        """Puts ``item`` on the queue, waiting while it is full until ``close()`` is called;
        False when it was closed first (the item is dropped)."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            while not self._stop.is_set() and self._offer(self._produce()):
                pass
        except BaseException as e:  # noqa: BLE001 - handed to the loop, which re-raises it
            # Kept beside the queue as well: with the queue full and the loop gone, the put
            # below gives up at close(), and the loop's next call still raises it.
            self._error = e
            self._offer(e)

    def __next__(self) -> tuple[Any, dict, dict]:
        start = time.perf_counter()
        if self._thread is None:
            item = self._produce()
        elif self._stop.is_set() and self._queue.empty():
            item = self._error or StopIteration()
        else:
            item = self._queue.get()
        self.wait_s += time.perf_counter() - start
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self, timeout_s: float = 30.0) -> None:
        """Stops the thread (a batch it is packing is finished and dropped). A producer stuck
        in a batch that does not end within ``timeout_s`` is left behind, with a warning (it
        is a daemon thread), so a run that is stopping always stops."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logging.warning(
                    'The input thread did not stop within %.0f s; left behind.', timeout_s
                )
