"""How far a quantized decoder drifts from its original on calibration text, and how fast each decodes.

``decoder_drift`` teacher-forces both models over the same token windows (the
text cut into pieces of at most ``window`` tokens, each run from an empty KV
cache) and compares the next-token distributions at every position: each
model's perplexity on the text, the mean and worst KL divergence
KL(original || quantized) in nats per token, the share of positions where both
pick the same greedy token, and the largest logit difference. The perplexity
is the text's under each model; on a random-weight test decoder only the
difference between the two means anything.

``decode_speed`` generates greedily with both folders through the real
generation engine, interleaved in rounds (best of each), and reports decode
tokens/s (after the first token) and time to first token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError

# The default calibration text: phone-agent turns like those the daemon serves (screen text,
# an instruction, the action asked for). A user's own text (--calibration FILE) is better.
DEFAULT_TEXT = (
    "You are a phone agent. The screen shows: Settings, Network and internet, Connected devices, Apps, "
    "Notifications, Battery 82 percent, Storage 41 GB used, Sound and vibration, Display, Wallpaper and style. "
    "Task: turn on Wi-Fi and connect to the network named Office. Next action: tap Network and internet.\n"
    "The screen shows: Internet, Wi-Fi off, Calls and SMS, SIMs, Airplane mode, Hotspot and tethering, "
    "Data Saver, VPN, Private DNS. Next action: tap Internet, then switch Wi-Fi on.\n"
    "The screen shows: Wi-Fi on, Office (secured), Guest, Printer-3F, Add network, Saved networks. "
    "Next action: tap Office and type the password from the task, then press Connect.\n"
    "Task: open the calendar and add a meeting tomorrow at 10:30 with the title Weekly review. "
    "The screen shows: Home, Phone, Messages, Chrome, Camera, Calendar, Photos, Clock. Next action: tap Calendar.\n"
    "The screen shows: December 2026, Today, 3 Thursday, No events, a plus button at the bottom right. "
    "Next action: tap the plus button, set the date to Friday 4 December, the time to 10:30, and the title.\n"
)


@dataclass(frozen=True)
class DecoderDrift:
    """Teacher-forced drift of a candidate decoder against its reference over ``tokens`` positions."""

    tokens: int
    windows: int
    perplexity_reference: float
    perplexity_candidate: float
    kl_mean: float  # nats per token, KL(reference || candidate)
    kl_max: float
    greedy_agreement: float  # share of positions whose arg-max token agrees
    max_abs_logit: float

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "windows": self.windows,
                "perplexity_reference": self.perplexity_reference,
                "perplexity_candidate": self.perplexity_candidate,
                "perplexity_ratio": self.perplexity_candidate / self.perplexity_reference,
                "kl_mean": self.kl_mean, "kl_max": self.kl_max, "greedy_agreement": self.greedy_agreement,
                "max_abs_logit": self.max_abs_logit}


def calibration_text(path: Path | None) -> tuple[str, str]:
    """(text, where it came from): a .txt file, every .txt of a folder in name order, or the default."""
    if path is None:
        return DEFAULT_TEXT, "default"
    path = Path(path)
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise InvalidInputError(f"--calibration for a decoder folder: expected a .txt file or a folder of .txt "
                                f"files, got {path}")
    try:
        text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"--calibration: cannot read {path} as UTF-8 text ({exc})") from None
    return text, str(path)


def token_windows(folder: Path, text: str, window: int, max_tokens: int) -> list[list[int]]:
    """``text`` through the folder's tokenizer, cut into windows of 2..``window`` tokens."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(Path(folder) / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    ids = ids[:max_tokens]
    windows = [ids[i:i + window] for i in range(0, len(ids), window)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise InvalidInputError(f"calibration text is {len(ids)} tokens; at least 2 are needed")
    return windows


def _session(folder: Path, threads: int) -> tuple[Any, Any]:
    from edge_runtime.generation.folder import read_folder

    description = read_folder(folder)
    return description, graph_session(description, description.model_path, threads)


def graph_session(description: Any, model_path: Path, threads: int) -> Any:
    """A plain ONNX Runtime session of ``model_path``, a graph with the I/O ``description`` describes."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if description.keeps_logits:
        options.log_severity_level = 3  # errors only: ORT warns of every overridable input (logits_to_keep)
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def kl_per_position(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """KL(reference || candidate) in nats at each position, from two [positions, vocab] log-probabilities."""
    return (np.exp(reference) * (reference - candidate)).sum(axis=-1)


def window_logits(description: Any, session: Any, tokens: Sequence[int]) -> np.ndarray:
    """Logits [positions, vocab] of one window from an empty cache (the whole window in one run)."""
    n = len(tokens)
    layout = description.kv
    feeds = {"input_ids": np.asarray(tokens, np.int64).reshape(1, n), "attention_mask": np.ones((1, n), np.int64)}
    if description.has_position_ids:
        feeds["position_ids"] = np.arange(n, dtype=np.int64).reshape(1, n)
    for layer in range(layout.layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = np.zeros((1, layout.kv_heads, 0, layout.head_dim),
                                                                 layout.dtype)
    return np.asarray(session.run(["logits"], feeds)[0][0], np.float64)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def decoder_drift(reference: Path, candidate: Path, text: str, *, window: int = 256, max_tokens: int = 2048,
                  threads: int = 2) -> DecoderDrift:
    """Teacher-forced comparison of two decoder folders with the same tokenizer (module docstring)."""
    ref_desc, ref_session = _session(reference, threads)
    cand_desc, cand_session = _session(candidate, threads)
    if ref_desc.vocab_size != cand_desc.vocab_size:
        raise InvalidInputError(f"the decoders' vocabularies differ: {ref_desc.vocab_size} vs {cand_desc.vocab_size}")
    windows = token_windows(reference, text, min(window, ref_desc.context_length), max_tokens)
    nll_ref = nll_cand = 0.0
    kls: list[np.ndarray] = []
    agree = positions = 0
    max_abs = 0.0
    for tokens in windows:
        ref_logits = window_logits(ref_desc, ref_session, tokens)
        cand_logits = window_logits(cand_desc, cand_session, tokens)
        ref_lp, cand_lp = log_softmax(ref_logits), log_softmax(cand_logits)
        targets = np.asarray(tokens[1:])
        rows = np.arange(len(targets))
        nll_ref -= float(ref_lp[rows, targets].sum())
        nll_cand -= float(cand_lp[rows, targets].sum())
        kls.append(kl_per_position(ref_lp, cand_lp))
        agree += int((ref_lp.argmax(-1) == cand_lp.argmax(-1)).sum())
        positions += len(tokens)
        max_abs = max(max_abs, float(np.abs(ref_logits - cand_logits).max()))
    predicted = sum(len(w) - 1 for w in windows)
    kl = np.concatenate(kls)
    return DecoderDrift(tokens=positions, windows=len(windows), perplexity_reference=math.exp(nll_ref / predicted),
                        perplexity_candidate=math.exp(nll_cand / predicted), kl_mean=float(kl.mean()),
                        kl_max=float(kl.max()), greedy_agreement=agree / positions, max_abs_logit=max_abs)


@dataclass(frozen=True)
class DecodeSpeed:
    """Best-of-rounds greedy decode speed of both folders (same prompt, same token count)."""

    new_tokens: int
    rounds: int
    reference_tokens_per_s: float
    candidate_tokens_per_s: float
    reference_ttft_ms: float
    candidate_ttft_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"new_tokens": self.new_tokens, "rounds": self.rounds,
                "reference_tokens_per_s": self.reference_tokens_per_s,
                "candidate_tokens_per_s": self.candidate_tokens_per_s,
                "speedup": self.candidate_tokens_per_s / self.reference_tokens_per_s,
                "reference_ttft_ms": self.reference_ttft_ms, "candidate_ttft_ms": self.candidate_ttft_ms}


def decode_speed(runtime: Any, folders: Sequence[Path], *, prompt: str | Sequence[int], new_tokens: int = 32,
                 rounds: int = 3, on_round: Callable[[int], None] | None = None) -> list[tuple[float, float]]:
    """(best decode tokens/s, best time to first token in ms) per folder; rounds interleave the folders."""
    if new_tokens < 2 or rounds < 1:
        raise InvalidInputError(f"decode speed needs new_tokens >= 2 and rounds >= 1, got {new_tokens}, {rounds}")
    models = []
    try:
        for i, folder in enumerate(folders):
            models.append(runtime.load_generative(folder, f"speed-{i}"))
        for model in models:  # warm-up: first runs allocate and pick kernels
            model.generate(prompt=prompt, max_tokens=2, ignore_eos=True)
        best = [(0.0, math.inf) for _ in models]
        for r in range(rounds):
            for i, model in enumerate(models):
                result = model.generate(prompt=prompt, max_tokens=new_tokens, ignore_eos=True)
                ttft = result.time_to_first_token_s or 0.0
                rate = (new_tokens - 1) / max(result.elapsed_s - ttft, 1e-9)
                best[i] = (max(best[i][0], rate), min(best[i][1], ttft * 1e3))
            if on_round is not None:
                on_round(r)
        return best
    finally:
        for model in models:
            model.close()


def compare_decode_speed(runtime: Any, reference: Path, candidate: Path, *, prompt: str | Sequence[int],
                         new_tokens: int = 32, rounds: int = 3) -> DecodeSpeed:
    (ref_rate, ref_ttft), (cand_rate, cand_ttft) = decode_speed(runtime, [reference, candidate], prompt=prompt,
                                                                new_tokens=new_tokens, rounds=rounds)
    return DecodeSpeed(new_tokens, rounds, ref_rate, cand_rate, ref_ttft, cand_ttft)
