"""Constrained decoding with llguidance: a grammar per request, a token mask per batch row.

``GrammarSpec`` says what a request's answer must match (a JSON schema, any
JSON object, a regex, one of some strings, a Lark/GBNF grammar, or a tool
parser's Lark grammar) and where in the request it came from, so an error
names the field. ``GrammarCache`` (one per model) builds llguidance's
tokenizer once from the model's ``tokenizers`` JSON and compiles each grammar
once (an LRU of matchers in their initial state); a request gets a deep copy,
its ``RowGuide``. Before each sampling step the row's logits lose every token
the grammar forbids; the sampled token is then consumed by the matcher. A row
ends when the matcher is stopped (the grammar admits nothing more) or the
model picks EOS, which the mask only allows where the grammar is complete.

``MaskPrefetch`` computes the masks of all guided rows of the running batch
on a worker thread while the model runs the decode step (llguidance and ONNX
Runtime both release the GIL), so the mask costs the step little wall time.

llguidance is the maintained engine vLLM, SGLang, llama.cpp and
onnxruntime-genai use; it is imported lazily (the ``generate`` extra).
"""

from __future__ import annotations

import collections
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from edge_runtime.errors import InvalidInputError

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar", "lark")
# Compact JSON (no free whitespace): a small model cannot waste its max_tokens on blank runs.
JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class GrammarSpec:
    """What the answer must match. ``source``: the schema as canonical JSON text, the regex, the choices
    as a JSON list, or the grammar text; ``where``: the request field it came from (for errors)."""

    kind: str
    source: str
    where: str = "grammar"
    # a thinking model's answer (generation.reasoning): the grammar holds after its reasoning, as vLLM
    # applies structured output once the reasoning ends. "open": the prompt opened <think>, so the answer
    # first closes it; "optional": a <think> block may come first; "": the grammar holds from the start.
    after_reasoning: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}; known: {KINDS}")
        if self.after_reasoning not in ("", "open", "optional"):
            raise ValueError(f"after_reasoning must be '', 'open' or 'optional', got {self.after_reasoning!r}")

    @staticmethod
    def json_schema(schema: Any, where: str) -> "GrammarSpec":
        if not isinstance(schema, dict):
            raise InvalidInputError(f"{where} must be a JSON schema object, got {type(schema).__name__}")
        return GrammarSpec("json_schema", json.dumps(schema), where)  # key order kept: the answer follows it

    @property
    def key(self) -> tuple[str, str]:
        # ``where`` only words errors: same grammar, same cache entry
        return self.kind + (f"+{self.after_reasoning}" if self.after_reasoning else ""), self.source

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's own form; InvalidInputError when it cannot even be read."""
        grammar = self._own_grammar()
        return _after_reasoning(grammar, self.after_reasoning) if self.after_reasoning else grammar

    def _own_grammar(self) -> str:
        from llguidance import LLMatcher, grammar_from

        try:
            if self.kind == "json_schema":
                return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            if self.kind == "json_object":
                return LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)
            if self.kind == "regex":
                return LLMatcher.grammar_from_regex(self.source)
            if self.kind == "choice":
                return grammar_from("choice", self.source)
            if self.kind == "grammar":
                return grammar_from("grammar", self.source)  # Lark or GBNF (llama.cpp's), as vLLM takes
            return LLMatcher.grammar_from_lark(self.source)
        except (ValueError, TypeError) as exc:
            raise InvalidInputError(f"{self.where}: {exc}") from None


# The reasoning before a constrained answer: text up to one </think> (never two), then blank space.
# Lark lexemes in llguidance may intersect (&) and negate (~) regular expressions.
_REASONING = (r"REASONING: /(?s:{open}.*<\/think>[ \t\n]*)/ & ~/(?s:.*<\/think>.*<\/think>.*)/")


def _after_reasoning(grammar: str, start: str) -> str:
    """``grammar`` (llguidance's JSON) behind a thinking model's reasoning: a Lark start rule that takes the
    reasoning, then the grammar itself as a named sub-grammar (``@answer``)."""
    top = json.loads(grammar)
    grammars = top["grammars"]
    grammars[0] = {**grammars[0], "name": "answer"}
    if start == "open":  # the block is open: closed first, whatever the model writes inside it
        lark = "start: REASONING @answer\n" + _REASONING.format(open="") + "\n"
    else:  # a <think> block may come first
        lark = "start: REASONING? @answer\n" + _REASONING.format(open=r"<think>") + "\n"
    return json.dumps({**top, "grammars": [{"lark_grammar": lark}, *grammars]})


class GrammarCache:
    """One model's llguidance tokenizer and its compiled grammars (thread-safe; LRU of ``capacity``).

    ``tokenizer_json`` gives the tokenizer's JSON when the first grammar needs it: a model that never
    constrains its output never holds that text (megabytes at a real vocabulary) or llguidance's tokenizer.
    """

    def __init__(self, tokenizer_json: Callable[[], str], vocab_size: int, eos: Iterable[int],
                 capacity: int = 64) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = sorted(eos)
        self.capacity = capacity
        self._tokenizer: Any = None
        self._compiled: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0  # grammars compiled (a cache hit compiles nothing)

    @property
    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    from llguidance import LLTokenizer
                except ImportError:
                    raise InvalidInputError("structured output needs the llguidance package, which is not "
                                            "installed here (pip install 'edge-runtime[generate]')") from None

                self._tokenizer = LLTokenizer(self._tokenizer_json(), n_vocab=self.vocab_size,
                                              eos_token=self._eos or None)
            return self._tokenizer

    def holds(self, spec: GrammarSpec) -> bool:
        """Whether ``spec`` is compiled already (``compile`` would return at once)."""
        with self._lock:
            return spec.key in self._compiled

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled matcher of ``spec`` in its initial state (shared: copy it before use).

        InvalidInputError naming ``spec.where`` when the grammar is invalid or unsupported.
        """
        with self._lock:
            if spec.key in self._compiled:
                self._compiled.move_to_end(spec.key)
                return self._compiled[spec.key]
        from llguidance import LLMatcher

        tokenizer = self.tokenizer
        grammar = spec.llguidance_grammar()
        error = LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise InvalidInputError(f"{spec.where}: {error.strip()}"[:1000])
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidInputError(f"{spec.where}: {matcher.get_error()}"[:1000])
        with self._lock:
            self.compiles += 1
            self._compiled[spec.key] = matcher
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return matcher

    def guide(self, spec: GrammarSpec) -> "RowGuide":
        """A fresh matcher for one request (compiled once per grammar, copied per request)."""
        return RowGuide(self.compile(spec).deep_copy(), self.vocab_size)


class RowGuide:
    """One sequence's matcher and its next-token mask."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.mask: np.ndarray | None = None  # bits for the next token; None: not computed yet

    @property
    def words(self) -> int:
        return (self.vocab_size + 31) // 32

    def compute_mask(self) -> None:
        from llguidance.numpy import fill_next_token_bitmask

        mask = np.zeros((1, self.words), np.int32)
        fill_next_token_bitmask(self.matcher, mask)
        self.mask = mask[0]

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every forbidden token at -inf (a new array); uses and clears the mask."""
        if self.mask is None:
            self.compute_mask()
        assert self.mask is not None
        allowed = np.unpackbits(self.mask.view(np.uint8), count=logits.shape[-1], bitorder="little").view(bool)
        self.mask = None
        if self.matcher.is_error() or not allowed.any():
            raise RuntimeError(f"the grammar admits no next token ({self.matcher.get_error() or 'empty mask'})")
        return np.where(allowed, logits, np.float32(-np.inf))

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token}: {self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar admits no further token (EOS aside): the answer is complete."""
        return bool(self.matcher.is_stopped())


class MaskPrefetch:
    """Computes the guided rows' masks on a worker thread while the decode step runs."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._executor: Any = None

    def start(self, guides: Sequence[RowGuide | None]) -> Future | None:
        """Begin computing the masks of ``guides`` (None entries: unguided rows); None when none is guided."""
        rows = [g for g in guides if g is not None and g.mask is None]
        if not rows:
            return None
        if self._pool is None:
            from llguidance import LLExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="edge-runtime-masks")
            self._executor = LLExecutor()
        return self._pool.submit(self._fill, rows)

    def _fill(self, rows: list[RowGuide]) -> None:
        from llguidance.numpy import fill_next_token_bitmask_par

        bitmask = np.zeros((len(rows), rows[0].words), np.int32)
        fill_next_token_bitmask_par(self._executor, [(g.matcher, i) for i, g in enumerate(rows)], bitmask)
        for i, guide in enumerate(rows):
            guide.mask = bitmask[i]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
