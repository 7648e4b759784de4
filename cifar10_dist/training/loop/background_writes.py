"""Training checkpoints written off the training loop's path (``checkpoint_in_background``): the loop waits only
for a copy of the checkpoint's tensors in host memory (on a GPU one copy per tensor), then a thread of its own
pickles the copy and writes it (a ResNet-18's 90 MB held the loop 97 ms inline and 43 ms in the background on a
2-core AVX2 EPYC, ``benchmarks.checkpoint_writes``; a GPU epoch of that model is about a second).
torch.distributed.checkpoint's ``async_save`` does the same for its own sharded folder format; the run's
checkpoints stay one ``.pt`` file each, as everything that reads them expects, so the copy and the thread are here.

One write at a time: a save (or a removal, which Ignite asks for before the save that replaces the file) waits
for the write before it, so files are written and pruned in order and one copy at most is held. A write that
fails (a full disk) ends the run with its one line at the next iteration (``raise_if_failed``), the next save or
``wait``. Whatever waits for the files on disk (a stop's checkpoint, the end of training, anything that reads
them) calls ``wait`` first."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any, Mapping

import ignite.distributed as idist
import torch
from ignite.handlers.checkpoint import BaseSaveHandler


def host_copy(value: Any, copied: dict[int, torch.Tensor] | None = None) -> Any:
    """``value`` with every tensor copied to host memory (one tensor named twice is copied once) and every
    container rebuilt, so that training may change the originals at once; a state dict keeps its ``_metadata``
    (the layers' versions that ``load_state_dict`` reads)."""
    copied = {} if copied is None else copied
    if isinstance(value, torch.Tensor):
        if id(value) not in copied:
            copied[id(value)] = value.detach().to("cpu", copy=True)
        return copied[id(value)]
    if isinstance(value, Mapping):
        rebuilt: dict[Any, Any] = OrderedDict() if type(value) is OrderedDict else {}
        rebuilt.update((key, host_copy(item, copied)) for key, item in value.items())
        if isinstance(rebuilt, OrderedDict) and hasattr(value, "_metadata"):
            setattr(rebuilt, "_metadata", copy.deepcopy(value._metadata))
        return rebuilt
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(host_copy(item, copied) for item in value)
    return copy.deepcopy(value)


class BackgroundWrites(BaseSaveHandler):
    """Wraps a save handler (``checkpointing.KeepUntilSaved``): each checkpoint is copied to host memory, then
    written by that handler on a thread of its own; removals pass through in order. Only the process that writes
    (rank 0) copies: the others call the handler as they would inline (it writes nothing there)."""

    def __init__(self, saver: BaseSaveHandler) -> None:
        self.saver = saver
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None

    def __call__(self, checkpoint: Mapping, filename: str, metadata: Mapping | None = None) -> None:
        self.wait()
        if idist.get_rank() != 0:
            self.saver(checkpoint, filename, metadata)
            return
        snapshot = host_copy(checkpoint)
        self.writer = threading.Thread(
            target=self._write,
            args=(snapshot, filename, copy.deepcopy(metadata)),
            name=f"checkpoint writer ({filename})",
        )
        self.writer.start()

    def _write(self, snapshot: Mapping, filename: str, metadata: Mapping | None) -> None:
        try:
            self.saver(snapshot, filename, metadata)
        except BaseException as failure:  # raised in the training thread, by raise_if_failed or wait
            self.failure = failure

    def remove(self, filename: str) -> None:
        self.wait()
        self.saver.remove(filename)

    @property
    def writing(self) -> bool:
        return self.writer is not None and self.writer.is_alive()

    def raise_if_failed(self) -> None:
        """The failure of a write that has ended, raised here (once); nothing waits."""
        if self.failure is not None and not self.writing:
            failure, self.failure = self.failure, None
            raise failure

    def wait(self) -> None:
        """Until the write in flight (if any) is on disk; its failure raised here."""
        if self.writer is not None:
            self.writer.join()
            self.writer = None
        self.raise_if_failed()
