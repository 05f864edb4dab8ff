"""Vision-language models: images in, image features spliced into a decoder's prompt.

``images`` decodes image inputs (PIL images, bytes, paths, ``data:``/``http(s)``/``file``
URLs under an allow-list) into RGB images with Pillow; ``preprocess`` turns one image into
the vision encoder's feeds and the text that stands for it in the prompt, per model family
(``qwen_preprocess``: Qwen2-VL / Qwen2.5-VL; ``idefics_preprocess``: Idefics3 / SmolVLM),
equal to transformers' image processors.

Nothing here imports Pillow or numpy at package import; the modules do when used.
"""

from __future__ import annotations
