"""ckptio_comm over torch.distributed: the collectives the library calls
for multi-rank saves (an all-gather and a broadcast of byte strings) and
group loads (an all-to-all of byte strings of any sizes), on a gloo group,
called by the library only from the thread that made the call. One
process without torch.distributed: rank 0 of 1."""
from __future__ import annotations

import ctypes
import datetime
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from . import _lib


def _view(addr: int, nbytes: int) -> torch.Tensor:
    """The nbytes at addr (the library's buffer) as a uint8 tensor, no copy."""
    if not nbytes:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_ubyte * nbytes).from_address(addr), dtype=torch.uint8)


_twins: Dict[Any, dist.ProcessGroup] = {}


def _gloo_twin(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    """A gloo group of group's ranks, made the first time (collectively:
    every rank of the group asks for it alike) and kept."""
    key = group if group is not None else "default"
    if key not in _twins:
        twin = dist.new_group(ranks=dist.get_process_group_ranks(group) if group is not None else None,
                              backend="gloo")
        if not isinstance(twin, dist.ProcessGroup):
            raise RuntimeError(f"ckptio: this process is not in the group {group}")
        _twins[key] = twin
    return _twins[key]


class Group:
    """A ckptio_comm (.comm) for `group` (None: the default group; alone:
    this process alone, rank 0 of 1). A group whose backend is not gloo
    gets a gloo twin: the library's bytes are on the host. timeout bounds
    each collective (None: the group's own): a rank that died or stopped
    calling makes the others' call fail after it instead of waiting. The
    first failure of a collective is kept in .error."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None,
                 timeout: Optional[datetime.timedelta] = None, alone: bool = False) -> None:
        self.error: Optional[BaseException] = None
        self.timeout = timeout
        self.group: Optional[dist.ProcessGroup]
        if not alone and dist.is_available() and dist.is_initialized():
            self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
            self.group = group if dist.get_backend(group) == "gloo" else _gloo_twin(group)
        else:
            self.rank, self.size, self.group = 0, 1, None
        self._allgather = _lib.ALLGATHER_FN(self._allgather_cb)
        self._broadcast = _lib.BROADCAST_FN(self._broadcast_cb)
        self._alltoallv = _lib.ALLTOALLV_FN(self._alltoallv_cb)
        self.comm = _lib.Comm(ctypes.sizeof(_lib.Comm), self.rank, self.size, None,
                              self._allgather, self._broadcast, self._alltoallv)

    def _fail(self, e: BaseException) -> int:
        if self.error is None:
            self.error = e
        return _lib.ERRORS["RANK"]

    def _wait(self, work: Any) -> None:
        """Waits for an async collective, within the timeout when one is set."""
        if self.timeout is None:
            work.wait()
        else:
            work.wait(timeout=self.timeout)

    def _allgather_cb(self, user: Optional[int], send: int, recv: int, nbytes: int) -> int:
        try:
            mine = _view(send, nbytes).clone()
            out = [_view(recv + r * nbytes, nbytes) for r in range(self.size)]
            if self.size == 1:
                out[0].copy_(mine)
            elif nbytes:
                self._wait(dist.all_gather(out, mine, group=self.group, async_op=True))
            return 0
        except Exception as e:  # noqa: BLE001 - reported by the call
            return self._fail(e)

    def _broadcast_cb(self, user: Optional[int], buf: int, nbytes: int, root: int) -> int:
        try:
            if self.size > 1 and nbytes:
                src = dist.get_global_rank(self.group, root) if self.group is not None else root
                self._wait(dist.broadcast(_view(buf, nbytes), src=src, group=self.group, async_op=True))
            return 0
        except Exception as e:  # noqa: BLE001
            return self._fail(e)

    def _alltoallv_cb(self, user: Optional[int], send: int, send_counts: Any, recv: int,
                      recv_counts: Any) -> int:
        try:
            sc: List[int] = [send_counts[r] for r in range(self.size)]
            rc: List[int] = [recv_counts[r] for r in range(self.size)]
            out, inp = _view(recv, sum(rc)), _view(send, sum(sc))
            if self.size == 1:
                out.copy_(inp)
            else:
                self._wait(dist.all_to_all_single(out, inp, output_split_sizes=rc, input_split_sizes=sc,
                                                  group=self.group, async_op=True))
            return 0
        except Exception as e:  # noqa: BLE001
            return self._fail(e)
