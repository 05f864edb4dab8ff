"""Generative models as v2 tensors: Triton's LLM interface (its vLLM backend's), text in and text out.

Triton serves an LLM as a model with a ``text_input`` BYTES tensor and a ``text_output`` one; its
clients (``tritonclient`` examples, genai-perf) call it with ``ModelStreamInfer`` over gRPC, or
``ModelInfer`` / ``/infer`` without streaming. The same request reaches a generative version here:

* ``text_input`` (BYTES, one element): the prompt, a plain completion prompt;
* ``stream`` (BOOL): one response per chunk of text (gRPC ``ModelStreamInfer`` only);
* ``sampling_parameters`` (BYTES, one JSON object): vLLM's sampling names (``max_tokens``,
  ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``ignore_eos`` ...), the OpenAI
  completions fields they share;
* ``exclude_input_in_output`` (BOOL): without it a whole (unstreamed) answer starts with the
  prompt, as the vLLM backend's does; streamed chunks never repeat it;
* any of ``SAMPLING_TENSORS`` as a one-element tensor, and the same names as request parameters
  (TensorRT-LLM's ensemble sends ``max_tokens`` so): tensors win over ``sampling_parameters``, which
  wins over parameters.

The answer is ``text_output`` (BYTES, one element). Bad tensors are ``InvalidInputError`` naming
them; the sampling values then pass ``openai_params.parse_completion``'s checks like any request's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from edge_runtime.errors import InvalidInputError

# (name, datatype, shape) as metadata declares them (the vLLM backend's), and the output
INPUTS = (("text_input", "BYTES", [1]), ("stream", "BOOL", [1]), ("sampling_parameters", "BYTES", [1]),
          ("exclude_input_in_output", "BOOL", [1]))
OUTPUTS = (("text_output", "BYTES", [-1]),)
SAMPLING_TENSORS = ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos",
                    "repetition_penalty", "frequency_penalty", "presence_penalty", "stop")
# request parameters that belong to the transport or the scheduler, never sampling
_TRANSPORT = frozenset({"priority", "timeout", "binary_data_output", "async", "sequence_id", "sequence_start",
                        "sequence_end", "triton_enable_empty_final_response"})


@dataclass(frozen=True)
class TextRequest:
    """A text request read from tensors: a ``/v1/completions`` body and how to answer it."""

    prompt: str
    body: dict[str, Any]  # for ``openai_params.parse_completion``
    stream: bool
    exclude_input: bool


def tensor_metadata() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) for model metadata and configuration."""
    return ([{"name": n, "datatype": d, "shape": list(s)} for n, d, s in INPUTS],
            [{"name": n, "datatype": d, "shape": list(s)} for n, d, s in OUTPUTS])


def text_request(model: str, arrays: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> TextRequest:
    """Read ``arrays`` (decoded v2 inputs) and the request's ``parameters``; InvalidInputError names a fault."""
    known = {name for name, _, _ in INPUTS} | set(SAMPLING_TENSORS)
    unknown = sorted(set(arrays) - known)
    if unknown:
        raise InvalidInputError(f"unknown input(s) {unknown} for a text generator; its inputs are "
                                f"{[name for name, _, _ in INPUTS]} and the sampling tensors {list(SAMPLING_TENSORS)}")
    if "text_input" not in arrays:
        raise InvalidInputError("a text generator needs the input 'text_input' (BYTES, one element: the prompt)")
    prompt = _text("text_input", arrays["text_input"])
    body = {k: v for k, v in parameters.items() if k not in _TRANSPORT and not k.startswith("triton_")}
    if "sampling_parameters" in arrays:
        raw = _text("sampling_parameters", arrays["sampling_parameters"])
        try:
            sampling = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise InvalidInputError(f"input 'sampling_parameters' must be a JSON object: {exc}") from None
        if not isinstance(sampling, dict):
            raise InvalidInputError(f"input 'sampling_parameters' must be a JSON object, got {raw[:80]!r}")
        body.update(sampling)
    for name in SAMPLING_TENSORS:
        if name in arrays:
            body[name] = _scalar(name, arrays[name])
    return TextRequest(prompt, {**body, "model": model, "prompt": prompt},
                       _flag("stream", arrays), _flag("exclude_input_in_output", arrays))


def is_text_generator(target: Any) -> bool:
    """Whether a served version generates text (its dispatcher is a ``GenerationDispatcher``)."""
    from edge_runtime.serving.generation_serving import GenerationDispatcher

    return isinstance(target.dispatcher, GenerationDispatcher)


async def open_stream(target: Any, request: TextRequest) -> Any:
    """The chunks of ``request`` on the generative version ``target`` (a ``BusyStream``: close it when
    not read to the end)."""
    from edge_runtime.generation.openai_params import parse_completion

    return await target.dispatcher.stream_completion(parse_completion(request.body))


async def whole_answer(target: Any, request: TextRequest) -> tuple[str, str | None]:
    """(``text_output``, finish reason) of an unstreamed request: the prompt first unless excluded."""
    chunks = await open_stream(target, request)
    texts, reason = [], None
    try:
        async for chunk in chunks:
            texts.append(chunk.text)
            reason = chunk.finish_reason or reason
    finally:
        await chunks.aclose()
    return ("" if request.exclude_input else request.prompt) + "".join(texts), reason


def text_output(text: str) -> dict[str, np.ndarray]:
    """The ``text_output`` tensor of one answer (or one streamed piece of it)."""
    array = np.empty(1, dtype=object)
    array[0] = text.encode()
    return {"text_output": array}


def _one(name: str, array: np.ndarray) -> Any:
    if array.size != 1:
        raise InvalidInputError(f"input {name!r} must hold one element, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _text(name: str, array: np.ndarray) -> str:
    value = _one(name, array)
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InvalidInputError(f"input {name!r} must be UTF-8 text") from None
    if isinstance(value, str):
        return value
    raise InvalidInputError(f"input {name!r} must be BYTES (text), got {array.dtype}")


def _flag(name: str, arrays: Mapping[str, np.ndarray]) -> bool:
    if name not in arrays:
        return False
    value = _one(name, arrays[name])
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(f"input {name!r} must be BOOL, got {arrays[name].dtype}")
    return bool(value)


def _scalar(name: str, array: np.ndarray) -> Any:
    """A sampling tensor's one value as JSON would carry it (``stop``: text)."""
    if array.dtype == object:
        return _text(name, array)
    return _one(name, array).item()
