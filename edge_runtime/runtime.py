"""``Runtime``: probes the device once, knows the backends, loads models onto them."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from backends.base import Availability, Backend, CompileOptions, backend_nodes_of, claimed_indices
from backends.descriptors import DESCRIPTORS, descriptor
from edge_runtime import backend_table
from edge_runtime.config import RuntimeConfig, runtime_config
from edge_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidInputError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedNodesError,
)
from edge_runtime.model import LoadReport, Model

if TYPE_CHECKING:
    import numpy as np

    from edge_runtime.generation.model import GenerativeModel
    from edge_runtime.generation.settings import GenerationSettings
    from edge_runtime.generation.vision.settings import VisionSettings
    from edge_runtime.planning.cost import BackendSpeed
    from edge_runtime.planning.executor import PlanExecutor
    from edge_runtime.planning.plans import Planner

log = logging.getLogger(__name__)

TFLITE_SUFFIXES = (".tflite", ".lite")


def _is_accelerator(name: str) -> bool:
    """Whether backend ``name`` can take ONNX nodes off the host: a GPU backend by its descriptor."""
    described = descriptor(name)
    return described is not None and described.device == "gpu" and described.takes("onnx")


def _takes(name: str, model_format: str) -> bool:
    described = descriptor(name)
    return described is not None and described.takes(model_format)


class Runtime:
    """Entry point of the library.

    ``Runtime()`` probes the device (``device_profiles.probe``), matches it
    against the catalogue and lazily builds backends as they are asked for.
    ``load`` compiles a model onto one backend; ``backend="auto"`` takes the
    first backend in the matched profile's order that can run every node.
    """

    def __init__(self, config: RuntimeConfig | None = None, *, profile: dict[str, Any] | None = None) -> None:
        from device_profiles import match, probe

        self.config = config or runtime_config()
        self.profile = profile if profile is not None else probe(
            self.config.probe_root, opencl=self.config.probe_opencl)
        self.match = match(self.profile, known_backends=DESCRIPTORS)
        self._backends: dict[str, tuple[Backend | None, Availability]] = {}
        self._constructed: set[str] = set()  # built here by name (the rest were injected)
        self._executor = ThreadPoolExecutor(max_workers=max(2, self.threads), thread_name_prefix="edge-runtime")

    @property
    def threads(self) -> int:
        """Intra-op threads: configured, else the profile's usable cores (cgroup quota respected)."""
        if self.config.intra_op_threads:
            return self.config.intra_op_threads
        return int(self.profile.get("cpu", {}).get("usable_cores") or os.cpu_count() or 1)

    def backend(self, name: str) -> Backend:
        """The backend called ``name``; raises BackendUnavailableError saying why not."""
        backend, availability = self._backend_entry(name)
        if backend is None or not availability.ok:
            raise BackendUnavailableError(f"backend {name!r} is not available: {availability.reason}")
        return backend

    def availability(self, name: str) -> Availability:
        return self._backend_entry(name)[1]

    def backend_order(self) -> list[str]:
        """The matched profile's backend order, then ``cpu`` if the profile left it out."""
        preferred = self.config.backend_order or self.match.backend_order
        order = [b for b in preferred if b in backend_table.BACKENDS]
        return order if "cpu" in order else [*order, "cpu"]

    def _backend_entry(self, name: str) -> tuple[Backend | None, Availability]:
        if name not in self._backends:
            self._backends[name] = backend_table.construct(name, self.config.cache_dir)
            self._constructed.add(name)
        return self._backends[name]

    def injected_backends(self) -> list[str]:
        """Backends given to this runtime object rather than built by name (tests, embedding apps):
        a child process built from the config could not rebuild them (``plan_choice``)."""
        return sorted(set(self._backends) - self._constructed)

    def compile_options(self) -> CompileOptions:
        return CompileOptions(
            intra_op_threads=self.threads,
            cache_dir=self.config.cache_dir,
            precision=self.config.precision,
            delegates=self.config.delegates + _catalogue_delegates(self.match.hints),
            cache_key_extra=self.device_key(),
        )

    def device_key(self) -> str:
        """A short fingerprint of the device for cache keys (build, CPU, profile)."""
        android = self.profile.get("android") or {}
        cpu = self.profile.get("cpu", {})
        text = "|".join([str(android.get("fingerprint", "")), str(cpu.get("model_name", "")),
                         ",".join(cpu.get("features", [])), self.match.name])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def load(self, path: str | os.PathLike, name: str | None = None, backend: str = "auto",
             options: CompileOptions | None = None, plan: str | None = None,
             input_shapes: Mapping[str, Sequence[int]] | None = None,
             sample: Mapping[str, np.ndarray] | None = None) -> Model:
        """Load and compile a model file (``.onnx``, ``.tflite``).

        ``backend`` NAME runs the whole model there. ``plan`` (``cpu``, ``gpu``,
        ``hybrid``, ``auto``) partitions an ONNX model across backends (see
        ``edge_runtime.planning``). ``backend="auto"`` (and ``plan="auto"``)
        choose by measurement where the profile's order holds an accelerator:
        the candidate plans are timed on this model at the served shape
        (``plan_race``; in a child process while no GPU driver is mapped, cached
        per model and device: ``plan_choice``) and only the winner is compiled;
        the report's ``decision`` holds every candidate's estimate and
        measurement. Without an accelerator, the first backend in the order
        (ORT and ncnn raced where both are in it). ``input_shapes`` is the
        served shape (dynamic dims) for the race and the cost estimates; ``sample``
        typical values of inputs that steer the work (a vision encoder's patch grid or
        mask), which the race runs on instead of seeded ones.

        Raises ModelNotFoundError (missing file), ModelLoadError (corrupt file),
        BackendUnavailableError / UnsupportedNodesError (the named backend or
        plan cannot take the whole model; the error lists the nodes),
        InvalidInputError (both a backend and a plan named).
        """
        path = Path(path)
        if path.is_dir():
            return self.load_generative(path, name)
        if not path.is_file():
            raise ModelNotFoundError(f"model file not found: {path}")
        if plan is not None and backend != "auto":
            raise InvalidInputError(f"name a backend ({backend!r}) or a plan ({plan!r}), not both")
        options = options or self.compile_options()
        name = name or path.stem
        if path.suffix.lower() in TFLITE_SUFFIXES:
            if (backend != "auto" and not _takes(backend, "tflite")) or plan is not None:
                takers = [n for n, d in DESCRIPTORS.items() if d.selectable and d.takes("tflite")]
                raise InvalidInputError(f"{path}: a .tflite model runs on a backend among {takers}, not "
                                        f"{backend if plan is None else 'plan ' + plan!r}")
            chosen = "tflite" if backend == "auto" else backend
            return self._compile(name, path, path, chosen, options, "TFLite model", ())
        from backends.onnx_graph import load_onnx

        proto = load_onnx(path)
        if backend != "auto":
            return self._compile(name, path, proto, backend, options, "requested", ())
        if plan is not None and plan != "auto":
            return self._load_plan(name, path, proto, plan, options, input_shapes)
        from edge_runtime.engine_choice import engine_for

        # The CPU engines (ORT, ncnn) race each other first (engine_choice); the winner is the host
        # side of the plan race, which times the plans over the host and the accelerator.
        choice = engine_for(self, proto, options, input_shapes) if plan is None else None
        host_engine = choice.backend if choice is not None else "cpu"
        lost = tuple((n, choice.reason) for n in ((*choice.raced, "cpu") if choice else ()) if n != host_engine)
        measured = self._load_measured(name, path, proto, options, input_shapes, plan is not None, host_engine,
                                       sample)
        if measured is not None:
            reason = measured.report.reason
            if choice is not None and measured.backend == host_engine != "cpu":  # both races' verdicts
                reason = f"{choice.reason}; {reason}"
            measured.report = dataclasses.replace(measured.report, reason=reason,
                                                  tried=(*measured.report.tried, *lost))
            return measured
        if plan is not None:
            return self._load_plan(name, path, proto, plan, options, input_shapes)
        if host_engine != "cpu":
            return self._compile(name, path, proto, host_engine, options, choice.reason, ())
        model = self._load_default(name, path, proto, options, input_shapes)
        if choice is not None:  # say why the other CPU engines lost
            model.report = dataclasses.replace(model.report, tried=(*model.report.tried, *lost))
        return model

    def measured_choice(self, path: Path, proto: Any, options: CompileOptions,
                        input_shapes: Mapping[str, Sequence[int]] | None,
                        sample: Mapping[str, np.ndarray] | None = None) -> Any:
        """``auto``'s measured race of plans for ``proto`` (``plan_choice.decide_plan``): a
        ``PlanDecision``, or None when no accelerator is in the backend order (``cpu`` alone)."""
        from edge_runtime.plan_choice import decide_plan

        return decide_plan(self, path, proto, options, input_shapes, sample)

    def _load_measured(self, name: str, path: Path, proto: Any, options: CompileOptions,
                       input_shapes: Mapping[str, Sequence[int]] | None, as_plan: bool,
                       host_engine: str = "cpu", sample: Mapping[str, np.ndarray] | None = None) -> Model | None:
        """The winner of the measured race, compiled (nothing else is); None when nothing races.
        ``as_plan``: ``plan="auto"`` (a plan executor even for cpu); else a ``cpu`` win loads
        ``host_engine`` whole (ORT, or ncnn where it won its race)."""
        decision = self.measured_choice(path, proto, options, input_shapes, sample)
        if decision is None:
            return None
        winner = decision.entry(decision.winner)
        shown = "unmeasured" if winner is None or winner.measured_ms is None else f"{winner.measured_ms:.3f} ms"
        label = "plan 'auto'" if as_plan else "auto"
        reason = (f"{label}: {decision.winner} measured fastest ({shown}; {decision.where}) on profile "
                  f"{self.match.name!r}: {decision.reason}")
        if decision.winner == "cpu" and not as_plan:
            model = self._compile(name, path, proto, host_engine, options, reason, ())
        else:
            model = self._load_plan(name, path, proto, decision.winner, options, input_shapes or decision.shapes)
            model.report = dataclasses.replace(model.report, reason=f"{reason}; {model.report.reason}")
        lost = tuple((e.name, e.note or f"measured {e.measured_ms} ms") for e in decision.entries
                     if e.name != decision.winner)
        model.report = dataclasses.replace(model.report, tried=(*model.report.tried, *lost), decision=decision)
        return model

    def _load_default(self, name: str, path: Path, proto: Any, options: CompileOptions,
                      input_shapes: Mapping[str, Sequence[int]] | None) -> Model:
        if self.accelerator() is not None:
            try:
                return self._load_plan(name, path, proto, "auto", options, input_shapes)
            except (BackendError, BackendUnavailableError, ModelLoadError) as exc:
                # NOTE: a model that loaded whole before must not stop loading because a split failed.
                log.warning("plan 'auto' for %s failed (%s); placing the whole model instead", path, exc)
        return self._load_auto(name, path, proto, options)

    def load_generative(self, folder: str | os.PathLike, name: str | None = None,
                        settings: "GenerationSettings | None" = None,
                        vision: "VisionSettings | None" = None) -> "GenerativeModel":
        """Load a decoder LLM folder (``optimum`` layout, see ``edge_runtime.generation``) or a
        vision-language one (transformers.js layout; its vision encoder is loaded by ``load`` with
        ``vision.plan``, see ``edge_runtime.generation.vision``).

        Raises ModelNotFoundError (no such folder, or not a generative one), ModelLoadError.
        """
        from edge_runtime.generation.folder import is_generative_folder
        from edge_runtime.generation.model import load_generative

        folder = Path(folder)
        if not is_generative_folder(folder):
            raise ModelNotFoundError(f"{folder} is not a generative model folder: expected tokenizer.json with "
                                     "model.onnx or onnx/model*.onnx + config.json (optimum, onnx-community), onnx/decoder_model_merged.onnx + "
                                     "embed_tokens + vision_encoder (a vision-language model) or genai_config.json")
        return load_generative(folder, name, settings, threads=self.threads, vision=vision,
                               vision_loader=self.load_vision_encoder, cache_dir=self.config.cache_dir)

    def load_vision_encoder(self, path: Path, plan: str,
                            input_shapes: Mapping[str, Sequence[int]] | None = None,
                            sample: Mapping[str, np.ndarray] | None = None) -> Model:
        """A VLM's vision encoder as a tensor model: ``plan`` ``auto`` is ``load``'s default choice;
        ``input_shapes``: a typical image's feed shapes (the patch count is dynamic in the graph);
        ``sample``: those feeds, which ``auto``'s race runs on (a zero patch grid encodes nothing).

        Its CPU threads do not spin: it runs beside the decoder's running streams on the same cores,
        and busy-waiting threads would take their time (measured on 2 cores: median inter-token gap
        of a running stream 15.7 ms while a screenshot encoded with spinning, 6.0 ms without).
        """
        options = dataclasses.replace(self.compile_options(), allow_spinning=False)
        return self.load(path, name=path.stem, plan=None if plan == "auto" else plan, options=options,
                         input_shapes=input_shapes, sample=sample)

    # -- plans across backends (edge_runtime.planning) -------------------------------
    def accelerator(self) -> str | None:
        """The first usable backend in the profile's order that can take ONNX nodes besides ``cpu``."""
        for candidate in self.backend_order():
            if not _is_accelerator(candidate):
                continue
            try:
                usable = self.availability(candidate).ok
            except Exception as exc:  # NOTE: a half-installed backend package must not break every load
                log.warning("backend %s cannot be constructed (%s: %s); planning without it",
                            candidate, type(exc).__name__, exc)
                self._backends[candidate] = (None, Availability.no(f"construction failed: {exc}"))
                usable = False
            if usable:
                return candidate
        return None

    def backend_speed(self, name: str) -> "BackendSpeed":
        """Calibrated speed of backend ``name``, measured once per device (``cache_dir/calibration.json``)."""
        from edge_runtime.planning.calibration import cached_speed

        device = f"{self.device_key()}|{self.availability(name).device}"
        key = hashlib.sha256(device.encode()).hexdigest()[:16]
        return cached_speed(self.backend(name), key, self.config.cache_dir, self.compile_options(),
                            on_host=name == "cpu")

    def planner(self, source: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                with_accelerator: bool = True) -> "Planner":
        """A Planner for ``source`` (path or ModelProto) over ``cpu`` and the accelerator, if any."""
        from backends.onnx_graph import load_onnx
        from edge_runtime.planning.plans import Planner

        accelerator = self.accelerator() if with_accelerator else None
        names = ["cpu", *([accelerator] if accelerator else [])]
        return Planner(load_onnx(source), {n: self.backend(n) for n in names},
                       {n: self.backend_speed(n) for n in names}, host="cpu", accelerator=accelerator,
                       input_shapes=input_shapes)

    def plans(self, path: str | os.PathLike, names: Sequence[str] | None = None,
              options: CompileOptions | None = None,
              input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, "PlanExecutor"]:
        """Compiled plans of one model by name (default: every plan this device has), for the scheduler."""
        planner = self.planner(Path(path), input_shapes)
        options = options or self.compile_options()
        return {n: planner.compile(planner.layout(n), options) for n in (names or planner.available())}

    def _load_plan(self, name: str, path: Path, proto: Any, plan: str, options: CompileOptions,
                   input_shapes: Mapping[str, Sequence[int]] | None) -> Model:
        planner = self.planner(proto, input_shapes, with_accelerator=plan != "cpu")
        layout = planner.layout(plan)
        executor = planner.compile(layout, options)
        label = "+".join(executor.backends)
        reason = (f"plan {plan!r}: {len(executor.stages)} stage(s), estimated "
                  f"{layout.partition.latency_s * 1e3:.3f} ms (profile {self.match.name!r})")
        host_only = planner.unclaimed_ops() if plan != "cpu" else {}
        if host_only:  # visible: which ops the accelerator left to the host (quantized ops, say)
            reason += "; on the host, not claimed by the accelerator: " + ", ".join(
                f"{op} x{n}" for op, n in host_only.items())
        report = LoadReport(label, reason, planner.prepared.original_node_count, executor.backend_nodes, ())
        log.info("loaded %s with %s", path, reason)
        return Model(name, path, executor, report, self._executor, options)

    def _load_auto(self, name: str, path: Path, proto: Any, options: CompileOptions) -> Model:
        from backends.onnx_graph import LazyTensorSpecs
        from edge_runtime.engine_choice import cpu_engines

        specs = LazyTensorSpecs(proto)  # shape inference only if a backend's supports() reads shapes
        raced = cpu_engines()
        tried: list[tuple[str, str]] = []
        for candidate in self.backend_order():
            if not _takes(candidate, "onnx") or candidate in raced:
                continue  # TFLite takes .tflite files only; ncnn was raced against cpu (engine_choice)
            backend_obj, availability = self._backend_entry(candidate)
            if backend_obj is None or not availability.ok:
                tried.append((candidate, availability.reason))
                continue
            claimed = claimed_indices(backend_obj, proto, specs)
            unclaimed = [n for i, n in enumerate(proto.graph.node) if i not in claimed]
            if unclaimed:
                tried.append((candidate, f"cannot take {len(unclaimed)} node(s), e.g. {unclaimed[0].op_type}"))
                continue
            try:
                return self._compile(name, path, proto, candidate, options,
                                     f"first in profile {self.match.name!r} order taking every node", tuple(tried))
            except (BackendError, BackendUnavailableError, ModelLoadError) as exc:
                if candidate == "cpu":
                    raise
                log.warning("backend %s failed to compile %s, trying the next: %s", candidate, path, exc)
                tried.append((candidate, f"compile failed: {exc}"))
        raise BackendUnavailableError(f"no backend can run {path}: {tried}")

    def _compile(self, name: str, path: Path, source: Any, backend_name: str, options: CompileOptions,
                 reason: str, tried: tuple[tuple[str, str], ...]) -> Model:
        backend_obj = self.backend(backend_name)
        node_count = len(source.graph.node) if hasattr(source, "graph") else 0
        if hasattr(source, "graph"):
            from backends.onnx_graph import LazyTensorSpecs, node_label

            specs = LazyTensorSpecs(source)  # see _load_auto
            claimed = claimed_indices(backend_obj, source, specs)
            unclaimed = [node_label(n, i) for i, n in enumerate(source.graph.node) if i not in claimed]
            if unclaimed:
                raise UnsupportedNodesError(backend_name, unclaimed)
        executable = backend_obj.compile(source, options)
        counts = backend_nodes_of(executable, backend_name, node_count)
        report = LoadReport(backend_name, reason, node_count or sum(counts.values()), counts, tried)
        log.info("loaded %s on %s (%s)", path, backend_name, reason)
        return Model(name, path, executable, report, self._executor, options)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _catalogue_delegates(hints: dict[str, Any]) -> tuple[Any, ...]:
    from backends.base import DelegateSpec

    delegate = hints.get("delegate") if isinstance(hints, dict) else None
    if not isinstance(delegate, dict) or not delegate.get("library"):
        return ()
    if delegate.get("present") is False:
        # The catalogue names a vendor library this device does not have: loading it could
        # only fail; the probe already said so in the match reasons.
        return ()
    options = delegate.get("options", {}) or {}
    return (DelegateSpec(str(delegate["library"]), tuple((str(k), str(v)) for k, v in options.items())),)
