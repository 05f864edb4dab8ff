"""The Responses API's stored responses: ``store``, ``previous_response_id`` and the retrieve routes.

OpenAI keeps every response (``store`` defaults to true) so that the next request can name it
with ``previous_response_id`` instead of resending the conversation, and clients can read one
back (``GET /v1/responses/{id}``, its ``/input_items``) or delete it. Here they are kept in this
process's memory, least recently used first out, under ``[server] responses_store_bytes`` (their
JSON size; 0 keeps nothing, and ``previous_response_id`` is then a 400 saying so); a restart
forgets them. Each record holds the Response and the whole conversation it answered — the
previous response's input and output items followed by the request's own input — so a chain
of ``previous_response_id`` needs only its last link. ``instructions`` are not carried over, as
OpenAI documents.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from edge_runtime.server.errors import ResponseNotFoundError


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the Response object as sent (its final state)
    input_items: list[dict[str, Any]]  # the conversation it answered, each item with an id
    nbytes: int

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a request naming this response continues: its input, then its output items."""
        return self.input_items + list(self.response.get("output") or [])


class ResponseStore:
    """At most ``budget_bytes`` of stored responses (0: none); event-loop side only."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def get(self, response_id: Any) -> StoredResponse:
        """The stored response (now the most recently used); ResponseNotFoundError (404) otherwise."""
        entry = self._entries.get(response_id) if isinstance(response_id, str) else None
        if entry is None:
            raise ResponseNotFoundError(f"Response with id {response_id!r} not found"
                                        + ("" if self.enabled else ": this server stores no responses "
                                                                  "([server] responses_store_bytes is 0)"))
        self._entries.move_to_end(response_id)
        return entry

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> bool:
        """Keep ``response`` with the conversation it answered; False when it alone exceeds the budget."""
        items = [item if "id" in item else {**item, "id": _item_id(item)} for item in input_items]
        nbytes = len(orjson.dumps(response)) + len(orjson.dumps(items))
        if nbytes > self.budget_bytes:
            return False
        old = self._entries.pop(response["id"], None)
        if old is not None:
            self._bytes -= old.nbytes
        self._entries[response["id"]] = StoredResponse(response, items, nbytes)
        self._bytes += nbytes
        while self._bytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
        return True

    def delete(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            raise ResponseNotFoundError(f"Response with id {response_id!r} not found")
        self._bytes -= entry.nbytes

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "bytes": self._bytes, "budget_bytes": self.budget_bytes}


def _item_id(item: dict[str, Any]) -> str:
    prefix = {"function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}.get(item.get("type", ""), "msg")
    return f"{prefix}_{uuid.uuid4().hex}"
