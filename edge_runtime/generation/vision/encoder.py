"""``VisionEncoder``: one image's preprocessed feeds → its ``image_features`` rows [tokens, hidden].

The graph is an ordinary tensor model: loaded through the runtime like any
other (``Runtime.load(path, plan=...)``, so on a phone it may run on the GPU
while the CPU decodes), given as a ``loader`` callable; without one (a model
built outside a ``Runtime``) it runs in an ONNX Runtime CPU session. It is
called on the thread that prepares a request, never on the batcher's. A fused
encoder (ONNX Runtime's contrib attention, what ``convert`` writes by default)
always gets plan ``cpu``: OpenCL and Vulkan cannot take its attention nodes.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from edge_runtime.errors import ModelLoadError

log = logging.getLogger(__name__)

# Runtime.load-like: (path, plan, input shapes of a typical image) -> an object with
# ``run(feeds) -> dict`` and ``inputs`` (specs with ``name``)
VisionLoader = Callable[[Path, str, Mapping[str, tuple[int, ...]], Mapping[str, np.ndarray]], Any]
# Qwen2-VL exports name the grid input ``grid_thw``, Qwen2.5-VL ones ``image_grid_thw``.
_GRID_NAMES = ("grid_thw", "image_grid_thw")


class _SessionModel:
    """The fallback runner: an ONNX Runtime CPU session with ``Model``'s ``run``/``inputs`` surface."""

    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # It runs beside the batcher's decode steps: spinning threads would take the decoder's cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ModelLoadError(f"{path}: onnxruntime cannot load it ({exc})") from None
        self.inputs = self.session.get_inputs()
        self.backend = "cpu"

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip([o.name for o in self.session.get_outputs()], self.session.run(None, dict(feeds))))

    def close(self) -> None:
        self.session = None


class VisionEncoder:
    """Runs ``vision_encoder`` on one image at a time; thread-safe.

    Requests prepare their images on their own threads, but their encodes take turns: each run
    already has the model's threads (all the cores it was given), so two at once only share them
    — both finish as late as the second would in turn, and each holds its activations (hundreds of
    MiB for a ~1,000-token screenshot with portable attention) at the same time, on a phone.
    """

    def __init__(self, path: Path, hidden_size: int, *, loader: VisionLoader | None = None, plan: str = "auto",
                 typical: Mapping[str, np.ndarray] | None = None, threads: int = 1) -> None:
        """``typical``: the feeds of an image at the budget's size; their shapes let a planner
        estimate the encoder's cost (the patch count is a dynamic dimension of the graph)."""
        import onnx

        self.path = Path(path)
        self.hidden_size = hidden_size
        self._turn = threading.Lock()  # one encode at a time (see the class docstring)
        model = onnx.load(str(self.path), load_external_data=False)
        self.input_names = {value.name for value in model.graph.input}
        if plan != "cpu" and any(entry.domain == "com.microsoft" for entry in model.opset_import):
            # A fused encoder (ONNX Runtime's MultiHeadAttention under If nodes, ``convert`` without
            # --portable-attention) is the CPU's form: a gpu plan's OpenCL/Vulkan stage cannot take those
            # nodes and would fall back to the host at every image.
            level = logging.INFO if plan == "auto" else logging.WARNING
            log.log(level, "vision encoder %s has fused attention (ONNX Runtime contrib ops): it runs on plan "
                    "cpu, not %s; convert with --portable-attention for a gpu plan", self.path.name, plan)
            plan = "cpu"
        if loader is None:
            self.model = _SessionModel(self.path, threads)
        else:
            sample = self._named(typical or {})
            self.model = loader(self.path, plan, {k: tuple(v.shape) for k, v in sample.items()}, sample)
        log.info("vision encoder %s on %s", self.path.name, getattr(self.model, "backend", "?"))

    def _named(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``feeds`` with the grid input under the name this graph uses."""
        named = dict(feeds)
        for name in _GRID_NAMES:  # the preprocessor may name the grid input for the other Qwen version
            other = _GRID_NAMES[1 - _GRID_NAMES.index(name)]
            if name in named and name not in self.input_names and other in self.input_names:
                named[other] = named.pop(name)
        return named

    def encode(self, feeds: Mapping[str, np.ndarray], tokens: int) -> np.ndarray:
        """``image_features`` of one image as [tokens, hidden] float32.

        ``tokens``: the rows the preprocessor promised (the image's tokens in the prompt).
        Raises ModelLoadError when the encoder gives another count: preprocessing and graph disagree.
        """
        with self._turn:
            features = np.asarray(self.model.run(self._named(feeds))["image_features"], np.float32)
        if features.shape[-1] != self.hidden_size:
            raise ModelLoadError(f"{self.path}: image_features {list(features.shape)} do not end in the decoder's "
                                 f"hidden size {self.hidden_size}")
        features = features.reshape(-1, self.hidden_size)  # idefics3: [tiles, seq, hidden] -> rows
        if features.shape[0] != tokens:
            raise ModelLoadError(f"{self.path}: the vision encoder gave {features.shape[0]} feature rows for an "
                                 f"image the preprocessor counted as {tokens} image tokens")
        return features

    def close(self) -> None:
        self.model.close()
