"""Chat messages with image parts: the images taken out in order, the messages shaped for a VLM chat template.

Accepted content parts (OpenAI's and transformers'):

* ``{"type": "text", "text": str}``;
* ``{"type": "image_url", "image_url": {"url": str, "detail": ...}}`` (or ``"image_url": str``); ``detail``
  is accepted and ignored;
* ``{"type": "image", "image": <PIL image | bytes | path | URL>}`` (the embedded API; transformers'
  ``url`` / ``path`` keys too).

An image part may carry its own ``min_pixels`` / ``max_pixels`` (qwen-vl-utils' per-image budget);
they win over the request's ``mm_processor_kwargs`` (vLLM's), which win over the model's ``[vision]``
budget. The model's image processor reads them (``ImageProcessor.request_budget``).

The template receives what transformers' processors hand it: each content a list
of parts, image parts as ``{"type": "image"}`` (both the Qwen2-VL and the
Idefics3/SmolVLM templates test ``type == "image"``). String content becomes one
text part, as vLLM does for templates that iterate over content parts
(SmolVLM's renders nothing of a plain string).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from edge_runtime.errors import InvalidInputError


@dataclass(frozen=True)
class ImageInput:
    """One image of a request, before decoding: ``source`` is a URL when ``is_url`` (an ``image_url``
    part), else what the embedded API accepts (PIL image, bytes, path, URL string)."""

    source: Any
    where: str  # e.g. "messages[1].content[2].image_url", for error messages
    is_url: bool
    # image processor arguments over the model's budget, each with where it came from, the last winning
    overrides: tuple[tuple[str, Mapping[str, Any]], ...] = ()


PART_BUDGET_KEYS = ("min_pixels", "max_pixels")  # qwen-vl-utils' per-image keys


def _with_overrides(image: ImageInput, part: Mapping[str, Any], where: str,
                    request: Mapping[str, Any] | None) -> ImageInput:
    own = {key: part[key] for key in PART_BUDGET_KEYS if part.get(key) is not None}
    overrides = ((("mm_processor_kwargs", request),) if request else ()) + (((where, own),) if own else ())
    return ImageInput(image.source, image.where, image.is_url, overrides) if overrides else image


def _image_of(part: Mapping[str, Any], where: str) -> ImageInput | None:
    kind = part.get("type")
    if kind == "image_url" or (kind is None and "image_url" in part):
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, Mapping) else value
        if not isinstance(url, str):
            raise InvalidInputError(f"{where}.image_url: expected {{'url': str}}, got {value!r}"[:300])
        return ImageInput(url, f"{where}.image_url", True)
    if kind == "image":
        for key in ("image", "url", "path"):
            if part.get(key) is not None:
                return ImageInput(part[key], f"{where}.{key}", False)
        raise InvalidInputError(f"{where}: an image part needs 'image' (a PIL image, bytes or a path) or 'url'")
    return None


def split_images(messages: Any, processor_kwargs: Mapping[str, Any] | None = None
                 ) -> tuple[list[dict[str, Any]], list[ImageInput]]:
    """(messages for the chat template, the image inputs in order of appearance); ``processor_kwargs``:
    the request's ``mm_processor_kwargs``, given to every image.

    Raises InvalidInputError naming the message and part for an unknown part type. Roles and
    the rest of each message are validated by the chat renderer.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidInputError("'messages' must be a non-empty list of {role, content} objects")
    shaped: list[dict[str, Any]] = []
    images: list[ImageInput] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidInputError(f"messages[{index}] must be an object, got {type(message).__name__}")
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif isinstance(content, (list, tuple)):
            parts = []
            for number, part in enumerate(content):
                where = f"messages[{index}].content[{number}]"
                if not isinstance(part, Mapping):
                    raise InvalidInputError(f"{where} must be an object, got {type(part).__name__}")
                image = _image_of(part, where)
                if image is not None:
                    images.append(_with_overrides(image, part, where, processor_kwargs))
                    parts.append({"type": "image"})
                elif part.get("type") == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                else:
                    raise InvalidInputError(f"{where} must be a text part {{'type': 'text', 'text': str}} or an "
                                            f"image part ('image_url' or 'image'), got {dict(part)!r}"[:300])
            content = parts
        shaped.append({**message, "content": content})
    return shaped, images


def image_inputs(images: Sequence[Any] | None, processor_kwargs: Mapping[str, Any] | None = None) -> list[ImageInput]:
    """The ``images=[...]`` argument of the embedded API as image inputs (``processor_kwargs`` as in
    ``split_images``)."""
    if images is None:
        return []
    if not isinstance(images, (list, tuple)):
        raise InvalidInputError(f"'images' must be a list of images, got {type(images).__name__}")
    overrides = (("mm_processor_kwargs", processor_kwargs),) if processor_kwargs else ()
    return [ImageInput(source, f"images[{i}]", False, overrides) for i, source in enumerate(images)]
