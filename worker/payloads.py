"""The data converter of every worker and client here: pydantic's, with the workflows' front door.

Payloads that come with a type (activity results, child workflow results, our own typed calls)
decode as `temporalio.contrib.pydantic` decodes them. Payloads that come without one are what the
workflows' entry points receive (`workflows.inbound`: they name no type, so that no argument a
client sends can fail a workflow task): a `json/plain` payload is read with the CLI's own JSON
rules (`workflows.json_input`), and one that cannot be read, whatever its bytes or encoding,
arrives as `workflows.json_input.Unreadable`, saying why, for the workflow to refuse in words instead of the SDK retrying
a failed task for ever.

Clients may use any converter that writes JSON (`json/plain`); the Temporal CLI and TypeScript's
default one do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter

from workflows.json_input import JSON_ENCODING, InputError, Unreadable, parse_json


class InboundPayloadConverter(PydanticPayloadConverter):
    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        if type_hints is not None:
            return super().from_payloads(payloads, type_hints)
        return [self._untyped(payload) for payload in payloads]

    def _untyped(self, payload: Payload) -> Any:
        if payload.metadata.get("encoding") == JSON_ENCODING:
            try:
                return parse_json(payload.data)
            except InputError as error:
                return Unreadable(f"is {error}")
        try:  # bytes, protobuf (the SDK's own answers, e.g. workflow metadata): the workflow door refuses them in words
            return super().from_payloads([payload], None)[0]
        except Exception:  # an unknown encoding, bytes that are not the protobuf they claim to be
            return Unreadable.of(payload.metadata.get("encoding", b""), payload.data)


DATA_CONVERTER = DataConverter(payload_converter_class=InboundPayloadConverter)
