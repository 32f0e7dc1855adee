"""The training batches on their way to the devices: a background thread reads ahead of the step."""

from __future__ import annotations

import queue
import threading
from collections import deque

from vitjax import tasks
from vitjax.mesh import to_global


def prefetch(data: tasks.TrainInput, task: tasks.Task, sharding, size: int = 2):
  """Yields (global batch, data position after it) with `size` batches already on their way to the devices.

  A background thread reads the host batches (the per-image work: decoding, crops, augmentation), so that it
  overlaps the device steps instead of taking turns with them; the main thread only hands each batch to the
  devices. Each batch carries the iterator's position taken right after it was read, so a checkpoint saves the
  position of the last batch consumed, not of the ones prefetched: a resumed run sees exactly the same batches.
  Closing the generator stops the thread. Batches made on the devices (data.on_device) are only dispatched: no thread.
  """
  if data.on_device:
    while True:
      yield next(data.batches), data.state()
  ready, done = queue.Queue(maxsize=size), threading.Event()

  def offer(item) -> None:  # waits for room, unless the consumer has gone
    while not done.is_set():
      try:
        return ready.put(item, timeout=0.1)
      except queue.Full:
        pass

  def read():
    try:
      while not done.is_set():
        offer((next(data.batches), data.state()))
    except BaseException as e:  # noqa: BLE001 -- raised again in the consumer's thread
      offer(e)

  reader = threading.Thread(target=read, name="vitjax-input", daemon=True)
  reader.start()
  on_device = deque()
  try:
    while True:
      while len(on_device) < size:
        item = ready.get()
        if isinstance(item, BaseException):
          raise item
        batch, state = item
        on_device.append((to_global(batch, sharding, task.batch_keys), state))
      yield on_device.popleft()
  finally:
    done.set()
    reader.join(timeout=10)
