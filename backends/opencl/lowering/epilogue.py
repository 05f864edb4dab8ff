"""Element-wise activations as OpenCL expressions, fused into a producer's store.

``ACTIVATE(v)`` is the composition of the node group's activations; a kernel
applies it to each value just before storing it, so Conv+BN+ReLU6 writes its
output once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from backends.opencl.attrs import node_attrs
from backends.opencl.lowering.context import LoweringContext
from backends.opencl.plan import render_float

if TYPE_CHECKING:
    import onnx

Expr = Callable[[str], str]


def _f(value: float) -> str:
    return render_float(value)


def _clip_bounds(node: "onnx.NodeProto", ctx: LoweringContext) -> tuple[float, float]:
    attrs = node_attrs(node)
    if ctx.opset < 11 or "min" in attrs or "max" in attrs:
        return float(attrs.get("min", -3.4028234663852886e38)), float(attrs.get("max", 3.4028234663852886e38))
    low = ctx.optional_value(node, 1, "Clip min")
    high = ctx.optional_value(node, 2, "Clip max")
    return (float(low.reshape(-1)[0]) if low is not None else float("-inf"),
            float(high.reshape(-1)[0]) if high is not None else float("inf"))


def activation(node: "onnx.NodeProto", ctx: LoweringContext) -> Expr:
    """The expression builder of one activation node (see support.ACTIVATIONS)."""
    op = node.op_type
    attrs = node_attrs(node)
    if op == "Relu":
        return lambda v: f"fmax({v}, 0.0f)"
    if op == "LeakyRelu":
        alpha = _f(attrs.get("alpha", 0.01))
        return lambda v: f"(fmax({v}, 0.0f) + {alpha} * fmin({v}, 0.0f))"
    if op == "Clip":
        low, high = _clip_bounds(node, ctx)
        return lambda v: f"fmin(fmax({v}, {_f(low)}), {_f(high)})"
    if op == "Sigmoid":
        return lambda v: f"(1.0f / (1.0f + exp(-({v}))))"
    if op == "HardSigmoid":
        alpha, beta = _f(attrs.get("alpha", 0.2)), _f(attrs.get("beta", 0.5))
        return lambda v: f"fmax(0.0f, fmin(1.0f, {alpha} * ({v}) + {beta}))"
    if op == "HardSwish":
        return lambda v: f"(({v}) * fmax(0.0f, fmin(1.0f, ({v}) * {_f(1.0 / 6.0)} + 0.5f)))"
    if op == "Gelu" and attrs.get("approximate", "none") == "tanh":
        c = _f(0.7978845608028654)
        return lambda v: f"(0.5f * ({v}) * (1.0f + tanh({c} * (({v}) + 0.044715f * ({v}) * ({v}) * ({v})))))"
    if op == "Gelu":
        return lambda v: f"(0.5f * ({v}) * (1.0f + erf(({v}) * {_f(0.7071067811865476)})))"
    if op == "Softplus":
        return lambda v: f"(fmax({v}, 0.0f) + log1p(exp(-fabs({v}))))"
    if op == "Elu":
        alpha = _f(attrs.get("alpha", 1.0))
        return lambda v: f"(({v}) >= 0.0f ? ({v}) : {alpha} * (exp({v}) - 1.0f))"
    simple = {"Tanh": "tanh({})", "Erf": "erf({})", "Neg": "(-({}))", "Abs": "fabs({})",
              "Exp": "exp({})", "Log": "log({})", "Sqrt": "sqrt({})", "Reciprocal": "(1.0f / ({}))",
              "Sin": "sin({})", "Cos": "cos({})"}
    template = simple[op]
    return lambda v: template.format(v)


BINARY_TEMPLATES = {
    "Add": "(({a}) + ({b}))", "Sub": "(({a}) - ({b}))", "Mul": "(({a}) * ({b}))",
    "Div": "(({a}) / ({b}))", "Pow": "onnx_pow({a}, {b})", "Max": "fmax({a}, {b})", "Min": "fmin({a}, {b})",
}


def compose(nodes: list["onnx.NodeProto"], ctx: LoweringContext, source: str) -> tuple[tuple[str, str], ...]:
    """Defines applying ``nodes`` (an element-wise DAG reading ``source``) as ``ACTIVATE(v)``.

    Empty ``nodes`` gives the identity. Otherwise the DAG becomes a per-instance
    function (a raw ``@epilogue`` code entry) so shared subexpressions are
    computed once.
    """
    if not nodes:
        return (("ACTIVATE(v)", "(v)"),)
    names = {source: "v"}

    def operand(name: str) -> str:
        if name in names:
            return names[name]
        return _f(float(ctx.value(name, "element-wise constant").reshape(-1)[0]))

    lines = []
    for k, node in enumerate(nodes):
        if node.op_type in BINARY_TEMPLATES and len(node.input) == 2:
            expr = BINARY_TEMPLATES[node.op_type].format(a=operand(node.input[0]), b=operand(node.input[1]))
        else:
            expr = activation(node, ctx)(operand(node.input[0]))
        names[node.output[0]] = f"t{k}"
        lines.append(f"    const float t{k} = {expr};")
    body = "\n".join(lines)
    function = f"inline float FN(epilogue)(const float v) {{\n{body}\n    return t{len(nodes) - 1};\n}}"
    return ("@epilogue", function), ("ACTIVATE(v)", "FN(epilogue)(v)")
