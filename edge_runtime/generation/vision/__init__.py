"""Vision-language models: images in, image features spliced into a decoder's prompt.

``images`` decodes image inputs (PIL images, bytes, paths, ``data:``/``http(s)``/``file``
URLs under an allow-list) into RGB images with Pillow; ``preprocess`` turns one image into
the vision encoder's feeds and the text that stands for it in the prompt, per model family
(``qwen_preprocess``: Qwen2-VL / Qwen2.5-VL; ``idefics_preprocess``: Idefics3 / SmolVLM),
equal to transformers' image processors.

The engine side: ``folder`` reads a transformers.js-layout folder (each part's precision
from ``settings``, the ``[vision]`` table); ``messages`` takes image parts out of chat
messages; ``encoder`` runs the vision encoder (a runtime tensor model) and ``embeddings``
the token embedding; ``splice`` puts image features at the image tokens; ``positions``
computes M-RoPE positions; ``prompt`` builds a request's decoder inputs and prefix-cache
key before it is queued; ``engine`` feeds them to the decoder; ``loading`` assembles the
parts for ``GenerativeModel``; ``demo`` is ``edge-runtime demo``'s screenshot step.

Nothing here imports Pillow or numpy at package import; the modules do when used.
"""

from __future__ import annotations
