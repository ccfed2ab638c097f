"""Stored responses of the Responses API (`store`, `previous_response_id`, `item_reference`, GET, DELETE and
input_items), in memory, least recently used first out once their JSON passes a byte budget.

Each stored response keeps its whole conversation: the input items it was answered from (a previous
response's conversation and output first) and its output items, so a chain continues from any link even
after older links are evicted or deleted. Items are kept as the JSON dicts the API shows."""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from runner.server.errors import APIError

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as GET /v1/responses/{id} returns it
    input_items: list[dict[str, Any]]  # what it answered, oldest first, each with an id
    nbytes: int  # its JSON's size, counted against the store's budget

    def conversation(self) -> list[dict[str, Any]]:
        """Its input and output items: the input of a response that names this one as previous."""
        return [*self.input_items, *self.response["output"]]


def with_id(item: dict[str, Any]) -> dict[str, Any]:
    """`item` with an id of its type's prefix when it came without one (a message given as a plain string)."""
    if item.get("id"):
        return item
    return {"id": f"{_ID_PREFIX.get(item.get('type', 'message'), 'item')}_{uuid.uuid4().hex}", **item}


class ResponseStore:
    """Responses by id (thread-safe: the event loop stores and reads, the worker does not touch it)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self._items: dict[str, list[Any]] = {}  # item id -> [the item, how many stored conversations hold it]
        self._nbytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        nbytes = len(json.dumps(response)) + len(json.dumps(input_items))
        if nbytes > self.max_bytes:
            return  # larger than the whole budget: it would only evict everything else
        stored = StoredResponse(response, input_items, nbytes)
        with self._lock:
            self._drop(response["id"])
            self._responses[response["id"]] = stored
            self._nbytes += nbytes
            for item in stored.conversation():
                self._items.setdefault(item["id"], [item, 0])[1] += 1
            while self._nbytes > self.max_bytes:
                self._drop(next(iter(self._responses)))

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        with self._lock:
            stored = self._responses.get(response_id)
            if stored is not None:
                self._responses.move_to_end(response_id)
                return stored
        where = f"{param}: " if param else ""
        raise APIError(404 if param is None else 400, f"{where}no stored response with id {response_id!r} (never "
                       f"stored, deleted, or evicted from the server's store)", param=param,
                       code="response_not_found" if param is None else None)

    def item(self, item_id: str, param: str) -> dict[str, Any]:
        with self._lock:
            found = self._items.get(item_id)
        if found is None:
            raise APIError(400, f"{param}: no stored item with id {item_id!r}", param=param)
        return found[0]

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        with self._lock:
            self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        stored = self._responses.pop(response_id, None)
        if stored is None:
            return
        self._nbytes -= stored.nbytes
        for item in stored.conversation():
            entry = self._items[item["id"]]
            entry[1] -= 1
            if entry[1] == 0:
                del self._items[item["id"]]
