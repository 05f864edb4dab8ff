"""KV of prompt prefixes kept across requests: fixed-size token blocks keyed by a chained hash.

As vLLM's automatic prefix caching does, a prompt is cut into blocks of
``block_tokens``; block ``i``'s key hashes block ``i - 1``'s key and the block's
own tokens, so one key names the whole prefix up to that block. A lookup walks
the prompt's keys until the first miss and returns the KV of the matched
prefix; the tokens of each entry are kept and compared, so a hash collision
can only cause a miss. Entries are evicted least-recently-used under a byte
budget; a lookup refreshes the deepest block first and the root last, so the
tails of long prefixes go before the shared heads they depend on.

With a ``PrefixStore`` (``prefix_store``: the blocks on disk) every block inserted is also
stored, and a lookup that misses in memory goes on along the prompt's blocks on disk: a
restarted daemon reuses the KV of the prompts it served before.

Thread-safe (the batcher's loop inserts; metrics read from the event loop).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from edge_runtime.generation.prefix_store import PrefixStore


@dataclass(frozen=True)
class PrefixCacheStats:
    lookups: int
    hits: int  # lookups that reused at least one block
    hit_tokens: int  # prompt tokens whose prefill was saved
    lookup_tokens: int  # prompt tokens looked up in total
    inserted_blocks: int
    evicted_blocks: int
    blocks: int
    bytes: int
    budget_bytes: int


@dataclass
class _Block:
    tokens: tuple[int, ...]
    kv: np.ndarray  # [2 * layers, heads, block_tokens, dim]


class PrefixCache:
    """Blocks of ``block_tokens`` positions; at most ``budget_bytes`` of KV kept (0 disables it)."""

    def __init__(self, block_tokens: int, budget_bytes: int, store: "PrefixStore | None" = None) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self.budget_bytes = budget_bytes
        self.store = store if budget_bytes > 0 else None
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._lookups = self._hits = self._hit_tokens = self._lookup_tokens = 0
        self._inserted = self._evicted = 0

    def _keys(self, tokens: Sequence[int], blocks: int) -> list[tuple[int, tuple[int, ...]]]:
        keys, parent, size = [], 0, self.block_tokens
        for i in range(blocks):
            chunk = tuple(int(t) for t in tokens[i * size:(i + 1) * size])
            parent = hash((parent, chunk))
            keys.append((parent, chunk))
        return keys

    def lookup(self, tokens: Sequence[int]) -> tuple[int, list[np.ndarray] | None]:
        """(tokens matched, their KV as ``2 * layers`` arrays [1, heads, n, dim]); at least one prompt
        token is always left to run, since its logits pick the first new token."""
        usable = (len(tokens) - 1) // self.block_tokens
        with self._lock:
            self._lookups += 1
            self._lookup_tokens += len(tokens)
            if self.budget_bytes <= 0:
                return 0, None
            found: list[tuple[int, _Block]] = []
            keys = self._keys(tokens, usable)
            for key, chunk in keys:
                block = self._blocks.get(key)
                if block is None or block.tokens != chunk:
                    break
                found.append((key, block))
            for key, _ in reversed(found):  # deepest first, root last: heads outlive tails
                self._blocks.move_to_end(key)
        if self.store is not None:  # on along the prompt on disk (no lock held while reading)
            for key, chunk in keys[len(found):]:
                kv = self.store.get(key, chunk)
                if kv is None:
                    break
                found.append((key, _Block(chunk, kv)))
                self._keep(key, found[-1][1])
        with self._lock:
            if not found:
                return 0, None
            self._hits += 1
            matched = len(found) * self.block_tokens
            self._hit_tokens += matched
        kv = np.concatenate([block.kv for _, block in found], axis=2)
        return matched, [kv[i][None] for i in range(kv.shape[0])]

    def peek(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` a ``lookup`` would match now; not counted, nothing made recent (for
        estimating a request's cost before deciding where it runs)."""
        usable = (len(tokens) - 1) // self.block_tokens
        matched = 0
        with self._lock:
            if self.budget_bytes <= 0:
                return 0
            for key, chunk in self._keys(tokens, usable):
                block = self._blocks.get(key)
                if (block is None or block.tokens != chunk) and (self.store is None or not self.store.contains(key)):
                    break
                matched += self.block_tokens
        return matched

    def insert(self, tokens: Sequence[int], kv: list[np.ndarray]) -> int:
        """Store the full blocks of ``tokens`` whose KV (``2 * layers`` arrays [1, heads, >= n, dim])
        is given and not cached yet; returns how many blocks were added."""
        if self.budget_bytes <= 0:
            return 0
        blocks = min(len(tokens), int(kv[0].shape[2])) // self.block_tokens
        added = 0
        size = self.block_tokens
        for i, (key, chunk) in enumerate(self._keys(tokens, blocks)):
            with self._lock:
                if key in self._blocks:
                    continue
            data = np.stack([a[0, :, i * size:(i + 1) * size] for a in kv])
            if data.nbytes > self.budget_bytes:
                return added
            if self._keep(key, _Block(chunk, data)):
                added += 1
                if self.store is not None:
                    self.store.put(key, chunk, data)
        return added

    def _keep(self, key: int, block: _Block) -> bool:
        """Hold ``block`` in memory (the least recently used go past the budget); False if it was there."""
        with self._lock:
            if key in self._blocks:
                return False
            self._blocks[key] = block
            self._bytes += block.kv.nbytes
            self._inserted += 1
            while self._bytes > self.budget_bytes:
                _, old = self._blocks.popitem(last=False)
                self._bytes -= old.kv.nbytes
                self._evicted += 1
        return True

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(self._lookups, self._hits, self._hit_tokens, self._lookup_tokens,
                                    self._inserted, self._evicted, len(self._blocks), self._bytes,
                                    self.budget_bytes)
