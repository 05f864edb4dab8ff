"""Plain-text rendering of ``edge-runtime plan``: one table of stages per plan."""

from __future__ import annotations

from typing import Any


def format_plans(report: dict[str, Any]) -> str:
    """The report of ``edge-runtime plan`` (its ``--json`` object) as readable text."""
    lines = [f"{report['model']}: {report['node_count']} nodes"]
    for name, speed in report["backends"].items():
        copy = "host memory" if speed["copy_gbps"] is None else (
            f"copies {speed['copy_gbps']:.2f} GB/s + {speed['copy_latency_us']:.1f} us")
        lines.append(f"  {name}: {speed['gflops']:.1f} GFLOP/s, {speed['mem_gbps']:.1f} GB/s, "
                     f"{speed['launch_us']:.1f} us/node, {speed['stage_us']:.1f} us/stage, {copy}")
    for plan in report["plans"]:
        lines.append("")
        lines.append(f"plan {plan['name']}: {' + '.join(plan['backends'])}, est {plan['est_ms']:.3f} ms "
                     f"per request, {plan['bottleneck_ms']:.3f} ms pipelined")
        if plan.get("host_only_ops"):
            ops = ", ".join(f"{op} x{n}" for op, n in plan["host_only_ops"].items())
            lines.append(f"  not claimed by the accelerator (run on the host): {ops}")
        lines.append(f"  {'#':>2}  {'backend':<8} {'nodes':>5} {'est ms':>9} {'copy':>10}  boundary")
        for k, stage in enumerate(plan["stages"]):
            inputs = ", ".join(f"{t['name']} ({_size(t['bytes'])})" for t in stage["inputs"])
            outputs = ", ".join(f"{t['name']} ({_size(t['bytes'])})" for t in stage["outputs"])
            lines.append(f"  {k:>2}  {stage['backend']:<8} {stage['node_count']:>5} {stage['est_ms']:>9.3f} "
                         f"{_size(stage['copy_bytes']):>10}  {inputs} -> {outputs}")
    decision = report.get("auto_decision")
    if decision:
        lines.append("")
        lines.append(f"auto, measured at {decision['shapes']} ({decision['where']}): {decision['winner']}")
        for entry in decision["candidates"]:
            est = "-" if entry["est_ms"] is None else f"{entry['est_ms']:.3f}"
            measured = "-" if entry["measured_ms"] is None else f"{entry['measured_ms']:.3f}"
            lines.append(f"  {entry['name']:<8} est {est:>9} ms  measured {measured:>9} ms  {entry['note']}".rstrip())
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
