"""The search attributes the workflows upsert, checked and registered on a namespace.

A workflow that upserts an attribute the namespace does not know fails its workflow task (the SDK
logs `BadSearchAttributes` once), and the server retries that task for ever: every mission would
hang. So a worker checks the namespace before it polls (`check`), and says in one line what is
missing and how to create it; `conductor search-attributes create` creates them where the caller
may (a self-hosted server, the dev server), as `temporal operator search-attribute create` would.
Temporal Cloud namespaces get them from the Cloud UI or `tcld` (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey

from workflows.mission.search import SEARCH_ATTRIBUTES

# The names the `temporal` CLI and the Temporal UI give each type.
TYPE_NAMES = {
    IndexedValueType.INDEXED_VALUE_TYPE_TEXT: "Text",
    IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD: "Keyword",
    IndexedValueType.INDEXED_VALUE_TYPE_INT: "Int",
    IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE: "Double",
    IndexedValueType.INDEXED_VALUE_TYPE_BOOL: "Bool",
    IndexedValueType.INDEXED_VALUE_TYPE_DATETIME: "Datetime",
    IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST: "KeywordList",
}


def type_name(key: SearchAttributeKey) -> str:
    return TYPE_NAMES[key.indexed_value_type]


@dataclass(frozen=True)
class Check:
    """What a namespace lacks of `SEARCH_ATTRIBUTES`: attributes not registered, and ones
    registered with another type (name, the type there)."""

    namespace: str
    missing: tuple[SearchAttributeKey, ...]
    mistyped: tuple[tuple[SearchAttributeKey, str], ...]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.mistyped

    def problem(self) -> str:
        """One line: what is wrong and the commands that put it right."""
        parts = []
        if self.missing:
            listed = ", ".join(f"{key.name} ({type_name(key)})" for key in self.missing)
            parts.append(
                f"namespace {self.namespace} lacks the search attribute{'s' if len(self.missing) > 1 else ''} {listed}, "
                "which missions upsert (without them every mission's workflow task fails and is retried for ever): "
                f"run `conductor --namespace {self.namespace} search-attributes create`, or "
                f"`temporal operator search-attribute create --namespace {self.namespace} "
                + " ".join(f"--name {key.name} --type {type_name(key)}" for key in self.missing) + "`"
            )
        for key, registered in self.mistyped:
            parts.append(
                f"search attribute {key.name} is registered on namespace {self.namespace} as {registered}, and missions "
                f"upsert it as {type_name(key)}: remove it (`temporal operator search-attribute remove --namespace "
                f"{self.namespace} --name {key.name}`) and run `conductor search-attributes create`"
            )
        return "; ".join(parts)


async def registered(client: Client, namespace: str) -> dict[str, int]:
    """Custom search attributes the server knows for `namespace`: name -> IndexedValueType."""
    response = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    return dict(response.custom_attributes)


async def check(client: Client, namespace: str, wanted: Sequence[SearchAttributeKey] = SEARCH_ATTRIBUTES) -> Check:
    known = await registered(client, namespace)
    return Check(
        namespace=namespace,
        missing=tuple(key for key in wanted if key.name not in known),
        mistyped=tuple(
            (key, TYPE_NAMES.get(known[key.name], str(known[key.name])))  # type: ignore[call-overload]
            for key in wanted if key.name in known and known[key.name] != key.indexed_value_type
        ),
    )


async def create(client: Client, namespace: str, keys: Sequence[SearchAttributeKey]) -> None:
    await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=namespace, search_attributes={key.name: key.indexed_value_type for key in keys},  # type: ignore[misc]
    ))
