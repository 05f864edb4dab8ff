"""Pipelined execution: one worker thread per stage, requests flowing through queues.

While stage k works on request n+1, stage k+1 works on request n, so stages
on different backends (the CPU and the GPU) are busy at the same time. Each
stage still sees requests one at a time and in order. A request whose stage
fails (after the executor's own fallback) skips the remaining stages; the
first such error is raised once every request has left the pipeline.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from edge_runtime.planning.runs import PlanRun, StageNote

if TYPE_CHECKING:
    from edge_runtime.planning.executor import PlanExecutor


@dataclass
class _Request:
    index: int
    env: dict[str, np.ndarray]
    notes: list["StageNote"] = field(default_factory=list)
    error: BaseException | None = None


_DONE = None  # end-of-stream marker passed down the queues


def run_pipelined(executor: "PlanExecutor", feeds_list: Sequence[Mapping[str, np.ndarray]]) -> list["PlanRun"]:
    """Results of ``feeds_list`` in order, stages overlapping across requests.

    Raises the first failing request's error (by request order) after the
    pipeline drained; no worker thread outlives the call.
    """
    if not feeds_list:
        return []
    queues: list[queue.Queue] = [queue.Queue() for _ in range(len(executor.stages) + 1)]

    def work(k: int) -> None:
        while True:
            request = queues[k].get()
            if request is _DONE:
                queues[k + 1].put(_DONE)
                return
            if request.error is None:
                try:
                    executor.advance(k, request.env, request.notes)
                except Exception as exc:  # handed to the caller after the drain
                    request.error = exc
                    request.env.clear()
            queues[k + 1].put(request)

    workers = [threading.Thread(target=work, args=(k,), name=f"plan-{executor.name}-stage{k}", daemon=True)
               for k in range(len(executor.stages))]
    for worker in workers:
        worker.start()
    for index, feeds in enumerate(feeds_list):
        queues[0].put(_Request(index, dict(feeds)))
    queues[0].put(_DONE)
    finished: list[_Request] = []
    while (request := queues[-1].get()) is not _DONE:
        finished.append(request)
    for worker in workers:
        worker.join()
    finished.sort(key=lambda r: r.index)
    for request in finished:
        if request.error is not None:
            raise request.error
    return [PlanRun.of(executor.collect(r.env), r.notes) for r in finished]
