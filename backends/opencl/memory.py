"""The memory plan: device buffers shared by tensors whose lifetimes do not overlap.

A storage lives from the step that first touches it to the step that last
reads it (inputs from before the first step, graph outputs until after the
last). Intervals are inclusive, so a kernel's output never shares a buffer
with one of its own inputs. Slots are assigned greedily in order of first
use: the smallest free slot that fits, else the largest free one (grown),
else a new slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.opencl.plan import Program


@dataclass(frozen=True)
class MemoryPlan:
    slot_of: dict[int, int]  # storage id -> slot index (inputs and temps)
    slot_elems: tuple[int, ...]
    planned_elems: int  # sum of slot sizes
    naive_elems: int  # one buffer per storage

    def nbytes(self, elem_bytes: int) -> tuple[int, int]:
        """(planned, naive) bytes for an element size."""
        return self.planned_elems * elem_bytes, self.naive_elems * elem_bytes


def lifetimes(program: Program) -> dict[int, tuple[int, int]]:
    """Storage id -> (first step, last step) for input and temp storages."""
    end = len(program.steps)
    span: dict[int, tuple[int, int]] = {}
    kinds = {s.sid: s.kind for s in program.storages}

    def touch(sid: int, step: int) -> None:
        first, last = span.get(sid, (step, step))
        span[sid] = (min(first, step), max(last, step))

    for storage in program.storages:
        if storage.kind == "input":
            touch(storage.sid, -1)
    for index, step in enumerate(program.steps):
        for arg in step.args:
            sid = program.tensors[arg].sid
            if kinds[sid] != "const":
                touch(sid, index)
    for name in program.outputs:
        ref = program.tensors.get(name)
        if ref is not None and kinds[ref.sid] != "const":
            touch(ref.sid, end)
    for storage in program.storages:  # produced but never read (defensive): keep to the end
        if storage.kind == "temp" and storage.sid not in span:
            span[storage.sid] = (0, end)
    return span


def plan_memory(program: Program) -> MemoryPlan:
    span = lifetimes(program)
    elems = {s.sid: s.elems for s in program.storages}
    order = sorted(span, key=lambda sid: (span[sid][0], -elems[sid]))
    slot_elems: list[int] = []
    slot_free_after: list[int] = []  # last step of the storage now holding the slot
    slot_of: dict[int, int] = {}
    for sid in order:
        first, last = span[sid]
        free = [k for k in range(len(slot_elems)) if slot_free_after[k] < first]
        fitting = [k for k in free if slot_elems[k] >= elems[sid]]
        if fitting:
            slot = min(fitting, key=lambda k: slot_elems[k])
        elif free:
            slot = max(free, key=lambda k: slot_elems[k])
            slot_elems[slot] = elems[sid]
        else:
            slot = len(slot_elems)
            slot_elems.append(elems[sid])
            slot_free_after.append(last)
        slot_free_after[slot] = last
        slot_of[sid] = slot
    return MemoryPlan(slot_of, tuple(slot_elems), sum(slot_elems), sum(elems[sid] for sid in span))
