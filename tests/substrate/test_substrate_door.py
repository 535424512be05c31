"""The substrate's front door over real HTTP: no input gets a 5xx, every refusal is a JSON 4xx, and
nothing stored before is lost.

The numbered cases are what a hostile test found (each failed before the door was built); the
property tests at the end throw random bytes, JSON of every shape, mutated documents, odd content
types and oversize bodies at every route that reads a body.
"""

from __future__ import annotations

import copy
import json
import logging
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.agentic_sandbox_api import RUNTIME_EXTENSION, build_message
from substrate.app import create_app
from substrate.config import (
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_NUMBER_LENGTH,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
)
from substrate.server import RunningSubstrate, serve_in_thread
from tests.support.substrate_fixtures import substrate_config
from tests.support.substrate_support import EXECUTOR_TOKEN, FLEET_TOKEN, record_dict
from workflows.workload.messages import TaskDispatch

pytestmark = pytest.mark.timeout(120)

FLEET = {"Authorization": f"Bearer {FLEET_TOKEN}"}
EXECUTOR = {"Authorization": f"Bearer {EXECUTOR_TOKEN}", "A2A-Extensions": RUNTIME_EXTENSION}
ADMIT = "/api/v2/fleet/workloads"
SEND = "/agents/local-1/v1/messages:send"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLWJ5dGVz"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSubstrate]:
    with serve_in_thread(substrate_config(tmp_path_factory.mktemp("door"), instances=2)) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: RunningSubstrate) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def kept(http: httpx.Client) -> dict[str, Any]:
    """A record admitted before any hostile input; every test checks it is still there, unchanged."""
    response = http.post(ADMIT, json=record_dict("door-kept"), headers=FLEET)
    assert response.status_code == 202
    return response.json()["workload"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def finished(http: httpx.Client) -> str:
    """A succeeded record: a valid message for it makes a `rejected` task and never runs anything."""
    http.post(ADMIT, json=record_dict("door-done"), headers=FLEET).raise_for_status()
    status = {"observed_state": "succeeded", "revision": 2, "last_seen": "2026-08-02T15:00:00Z", "artifacts": [],
              "exit_classification": "success"}  # fmt: skip
    observed = http.post(f"{ADMIT}/door-done/observations", json={"expected_revision": 1, "status": status},
                         headers=FLEET)  # fmt: skip
    assert observed.status_code == 200, observed.text
    return "door-done"


@pytest.fixture(autouse=True)
def nothing_lost(http: httpx.Client, kept: dict[str, Any]) -> Iterator[None]:
    yield
    assert_kept(http, kept)


def assert_kept(http: httpx.Client, kept: dict[str, Any]) -> None:
    response = http.get(f"{ADMIT}/door-kept", headers=FLEET)
    assert (response.status_code, response.json()) == (200, kept)


def assert_json_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    body = json.loads(response.content)
    if response.headers["content-type"] == "application/problem+json":  # the A2A plane: RFC 7807, same code
        body = {**body, "error": body["code"], "message": body["detail"]}
    else:
        assert response.headers["content-type"] == "application/json"
    assert isinstance(body, dict) and isinstance(body["error"], str) and isinstance(body["message"], str)
    if code is not None:
        assert body["error"] == code, body
    return body


def message(child_id: str, prompt: str = "true", message_id: str | None = None) -> dict[str, Any]:
    dispatch = TaskDispatch(message_id=message_id or f"msg-{child_id}", child_id=child_id, kind="one-shot-command",
                        prompt=prompt)  # fmt: skip
    return build_message(dispatch).wire()


def tasks_of(server: RunningSubstrate, child_id: str) -> list[str]:
    db = sqlite3.connect(f"file:{server.config.database}?mode=ro", uri=True)
    try:
        return [row[0] for row in db.execute("SELECT state FROM tasks WHERE child_id = ?", (child_id,))]
    finally:
        db.close()


def nested(depth: int) -> bytes:
    return b'{"deep": ' + b"[" * depth + b"]" * depth + b"}"


# --- raw HTTP, for bodies a client would never finish sending ------------------------------------


def exchange(
    server: RunningSubstrate, head: bytes, body: bytes = b"", timeout: float = 10
) -> tuple[int, dict[str, str], bytes, bool]:
    """Send `head` and `body` on a fresh connection, read one response: (status, headers, body, closed)."""
    url = urlparse(server.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pytest.fail(f"no answer within {timeout} s: the substrate is waiting for the rest of the body")
        header_block, _, rest = data.partition(b"\r\n\r\n")
        lines = header_block.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = (line.partition(":") for line in lines[1:])
        headers = {name.strip().lower(): value.strip() for name, _, value in fields}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        try:
            closed = sock.recv(1) == b""
        except (TimeoutError, ConnectionResetError):
            closed = False
        return status, headers, rest[:length], closed


def request_head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: substrate", *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(payload: bytes, size: int = 65536) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(payload[i : i + size]), payload[i : i + size])
                    for i in range(0, len(payload), size))  # fmt: skip


# --- 1. nesting ---------------------------------------------------------------------------------

BODY_ROUTES = [
    (ADMIT, FLEET, "fleet.invalid_record"),
    (f"{ADMIT}/door-kept/observations", FLEET, "fleet.invalid_observation"),
    ("/api/v2/fleet/reconcile", FLEET, "fleet.invalid_request"),
    (SEND, EXECUTOR, "executor.invalid_message"),
]
ROUTE_IDS = ["admit", "observe", "reconcile", "send"]


@pytest.mark.parametrize(("path", "auth", "code"), BODY_ROUTES, ids=ROUTE_IDS)
def test_1_json_nested_100000_levels_is_400_not_a_recursion_error(
    http: httpx.Client, path: str, auth: dict[str, str], code: str
) -> None:
    body = assert_json_error(http.post(path, content=nested(100_000), headers=auth), 400, code)
    assert f"nests 100001 levels deep; the limit is {DEFAULT_MAX_JSON_DEPTH}" in body["message"]


def test_1_nesting_up_to_the_limit_still_reaches_the_rules(http: httpx.Client) -> None:
    record = record_dict("door-deep")
    inner: Any = 1
    for _ in range(DEFAULT_MAX_JSON_DEPTH - 3):  # the record, spec, orchestrator_metadata, then these
        inner = {"d": inner}
    record["spec"]["orchestrator_metadata"] = {"deep": inner}
    assert http.post(ADMIT, json=record, headers=FLEET).status_code == 202
    record["spec"]["orchestrator_metadata"] = {"deep": {"d": inner}}
    record["lineage"]["child_id"] = "door-deeper"
    assert "nests 65 levels deep" in assert_json_error(http.post(ADMIT, json=record, headers=FLEET), 400)["message"]


# --- 2. size ------------------------------------------------------------------------------------


def test_2_a_declared_64_mb_body_is_413_before_a_byte_of_it_is_read(server: RunningSubstrate) -> None:
    head = request_head(ADMIT, {**FLEET, "Content-Type": "application/json", "Content-Length": str(64 << 20)})
    status, headers, body, closed = exchange(server, head, b'{"document_type": "workload", ')
    assert (status, headers["content-type"], headers["connection"]) == (413, "application/json", "close")
    assert json.loads(body)["error"] == "http.payload_too_large"
    assert closed, "the connection stays open: the rest of the body would be drained"


def test_2_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(server: RunningSubstrate) -> None:
    head = request_head(SEND, {**EXECUTOR, "Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    # One byte past the limit, and no final chunk: the body has not ended when the answer comes.
    status, headers, body, closed = exchange(server, head, chunked(b" " * (DEFAULT_MAX_REQUEST_BYTES + 1)))
    assert (status, headers["connection"]) == (413, "close")
    assert json.loads(body)["error"] == "http.payload_too_large"
    assert closed


def test_2_a_body_at_the_limit_is_read_and_judged(http: httpx.Client) -> None:
    body = json.dumps(message("door-absent")).encode()
    padded = body + b" " * (DEFAULT_MAX_REQUEST_BYTES - len(body))
    assert_json_error(http.post(SEND, content=padded, headers=EXECUTOR), 404, "fleet.workload_not_found")


def test_2_a_record_over_256_kib_is_refused_before_it_is_stored(http: httpx.Client) -> None:
    record = record_dict("door-huge")
    record["spec"]["orchestrator_metadata"] = {"blob": "x" * DEFAULT_MAX_RECORD_BYTES}
    body = assert_json_error(http.post(ADMIT, json=record, headers=FLEET), 413, "fleet.record_too_large")
    assert f"at most {DEFAULT_MAX_RECORD_BYTES} bytes" in body["message"]
    assert_json_error(http.get(f"{ADMIT}/door-huge", headers=FLEET), 404, "fleet.workload_not_found")


def test_2_an_observation_that_would_grow_a_record_past_the_limit_changes_nothing(http: httpx.Client) -> None:
    http.post(ADMIT, json=record_dict("door-grow"), headers=FLEET).raise_for_status()
    before = http.get(f"{ADMIT}/door-grow", headers=FLEET).json()
    artifacts = [{"kind": "log", "uri": f"file:///logs/{n:05d}-" + "x" * 60, "sha256": "0" * 64} for n in range(3000)]
    status = {"observed_state": "running", "revision": 2, "last_seen": "2026-08-02T15:00:00Z", "artifacts": artifacts}
    response = http.post(f"{ADMIT}/door-grow/observations", json={"expected_revision": 1, "status": status},
                         headers=FLEET)  # fmt: skip
    assert_json_error(response, 413, "fleet.record_too_large")
    assert http.get(f"{ADMIT}/door-grow", headers=FLEET).json() == before


# --- 3. numbers, text, content types -----------------------------------------------------------


@pytest.mark.parametrize(("path", "auth", "code"), BODY_ROUTES, ids=ROUTE_IDS)
def test_3_an_integer_of_5000_digits_is_400(http: httpx.Client, path: str, auth: dict[str, str], code: str) -> None:
    body = assert_json_error(http.post(path, content=b'{"n": ' + b"7" * 5000 + b"}", headers=auth), 400, code)
    assert f"longer than {DEFAULT_MAX_NUMBER_LENGTH} characters" in body["message"]


def test_3_a_record_with_a_5000_digit_budget_is_400(http: httpx.Client) -> None:
    text = json.dumps(record_dict("door-digits")).replace('"timeout_seconds": 60', '"timeout_seconds": ' + "9" * 5000)
    assert_json_error(http.post(ADMIT, content=text, headers=FLEET), 400, "fleet.invalid_record")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_3_nan_and_infinity_are_not_json_and_run_nothing(
    http: httpx.Client, server: RunningSubstrate, constant: str
) -> None:
    http.post(ADMIT, json=record_dict(f"door-nan{constant}"), headers=FLEET).raise_for_status()
    # message.metadata is open (any JSON): the constant is the only thing wrong with this message.
    text = json.dumps(message(f"door-nan{constant}"))
    text = text.replace('"metadata": {', f'"metadata": {{"weight": {constant}, ', 1)
    assert_json_error(http.post(SEND, content=text, headers=EXECUTOR), 400, "executor.invalid_message")
    assert tasks_of(server, f"door-nan{constant}") == []


@pytest.mark.parametrize(
    "raw",
    [b'{"message": "\xff\xfe"}', b'{"m": "\xed\xa0\x80"}', b'{"m": "\\ud800"}', b'{"m": "\\udfff\\ud800"}'],
    ids=["invalid-utf8", "utf8-encoded-surrogate", "lone-high-escape", "reversed-pair-escape"],
)
@pytest.mark.parametrize(("path", "auth", "code"), BODY_ROUTES, ids=ROUTE_IDS)
def test_3_text_that_is_not_unicode_is_400(
    http: httpx.Client, raw: bytes, path: str, auth: dict[str, str], code: str
) -> None:
    assert_json_error(http.post(path, content=raw, headers=auth), 400, code)


def test_3_a_surrogate_inside_an_otherwise_valid_record_is_400(http: httpx.Client) -> None:
    text = json.dumps(record_dict("door-surrogate")).replace('"mission-substrate"', '"mission-\\ud800"')
    assert_json_error(http.post(ADMIT, content=text, headers=FLEET), 400, "fleet.invalid_record")
    assert_json_error(http.get(f"{ADMIT}/door-surrogate", headers=FLEET), 404)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml"],
)
def test_3_a_body_that_says_it_is_not_json_is_415(http: httpx.Client, content_type: str) -> None:
    response = http.post(ADMIT, content=json.dumps(record_dict("door-ctype")),
                         headers={**FLEET, "Content-Type": content_type})  # fmt: skip
    assert_json_error(response, 415, "http.unsupported_media_type")
    assert_json_error(http.get(f"{ADMIT}/door-ctype", headers=FLEET), 404)


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "application/merge-patch+json", None]
)
def test_3_json_content_types_and_none_at_all_are_read(http: httpx.Client, content_type: str | None) -> None:
    headers = dict(FLEET) if content_type is None else {**FLEET, "Content-Type": content_type}
    assert http.post(ADMIT, content=json.dumps(record_dict("door-json")), headers=headers).status_code in (200, 202)


@pytest.mark.parametrize(("path", "auth", "code"), BODY_ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize("value", [[], [1, 2], "text", 1, 1.5, True, None], ids=str)
def test_3_json_that_is_not_an_object_is_400(
    http: httpx.Client, path: str, auth: dict[str, str], code: str, value: object
) -> None:
    assert_json_error(http.post(path, json=value, headers=auth), 400, code)


@pytest.mark.parametrize(
    "where",
    ["lineage.mission_id", "spec.schedule", "spec.capabilities.0.name", "status.error_code", "kind"],
)
def test_3_a_huge_string_in_any_record_field_is_a_4xx_and_stores_nothing(http: httpx.Client, where: str) -> None:
    record = record_dict("door-long")
    target: Any = record
    *parents, last = where.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = "y" * 600_000
    response = http.post(ADMIT, json=record, headers=FLEET)
    assert response.status_code in (400, 413)
    assert_json_error(response, response.status_code)
    assert_json_error(http.get(f"{ADMIT}/door-long", headers=FLEET), 404)


def test_3_a_huge_prompt_is_answered_without_a_5xx(http: httpx.Client, finished: str) -> None:
    response = http.post(SEND, json=message(finished, "echo " + "z" * 900_000, "msg-door-huge-prompt"),
                         headers=EXECUTOR)  # fmt: skip
    assert response.status_code == 202 and response.json()["status"]["state"] == "rejected"


# --- 4. the executor's own input -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda m: m["message"]["metadata"].update(authorization="Bearer x"), "$.message.metadata.authorization"),
        (lambda m: m["message"].update(metadata={**m["message"]["metadata"], "headers": {"Cookie": "s=1"}}),
         "$.message.metadata.headers.Cookie"),
        (lambda m: m["message"]["parts"][0].update(text=f"curl -H 'X-Id: {JWT}' https://api.example"),
         "$.message.parts[0].text"),
        (lambda m: m["message"]["metadata"].update(note=JWT), "$.message.metadata.note"),
        (lambda m: m.update(metadata={"x": "Bearer abc123def456"}), "$.metadata.x"),
    ],
    ids=["authorization-key", "cookie-key", "jwt-in-command", "jwt-in-metadata", "bearer-value"],
)
def test_4_credential_material_in_a_message_is_400_and_runs_nothing(
    http: httpx.Client, server: RunningSubstrate, change: Any, where: str
) -> None:
    child = f"door-cred-{where.replace('$', '').replace('.', '-').replace('[', '').replace(']', '')}"
    http.post(ADMIT, json=record_dict(child), headers=FLEET).raise_for_status()
    body = message(child, "echo ran > ran.txt")
    change(body)
    refusal = assert_json_error(http.post(SEND, json=body, headers=EXECUTOR), 400, "executor.invalid_message")
    assert where in refusal["message"] and "credential material" in refusal["message"]
    assert JWT not in refusal["message"] and "abc123def456" not in refusal["message"]
    assert tasks_of(server, child) == []
    assert http.get(f"{ADMIT}/{child}", headers=FLEET).json()["status"]["observed_state"] == "admitted"


def test_4_a_command_that_uses_a_secret_from_the_environment_is_sent(http: httpx.Client, finished: str) -> None:
    body = message(finished, 'curl -H "Authorization: Bearer $API_TOKEN" https://api.example', "msg-door-env")
    assert http.post(SEND, json=body, headers=EXECUTOR).status_code == 202


def test_4_credential_values_in_a_record_are_400(http: httpx.Client) -> None:
    record = record_dict("door-cred-record")
    record["spec"]["orchestrator_metadata"] = {"conductor": {"lane": f"{JWT}"}}
    body = assert_json_error(http.post(ADMIT, json=record, headers=FLEET), 400, "fleet.invalid_record")
    assert "$.spec.orchestrator_metadata.conductor.lane (a value that looks like a JWT)" in body["message"]
    assert JWT not in body["message"]


def test_4_a_nul_in_a_command_is_400_and_runs_nothing(http: httpx.Client, server: RunningSubstrate) -> None:
    child = "door-nul-prompt"
    http.post(ADMIT, json=record_dict(child), headers=FLEET).raise_for_status()
    body = message(child, "echo a\x00b")
    refusal = assert_json_error(http.post(SEND, json=body, headers=EXECUTOR), 400, "executor.invalid_message")
    assert "NUL" in refusal["message"]
    assert tasks_of(server, child) == []


@pytest.mark.parametrize(
    "schedule", ["\u00b2 * * * *", "*/\u0663 * * * *", "1" * 5000 + " * * * *", "*/" + "9" * 5000 + " * * * *"]
)
def test_4_a_schedule_of_odd_digits_is_422(http: httpx.Client, schedule: str) -> None:
    child = f"door-cron-{len(schedule)}-{ord(schedule[0])}"
    record = record_dict(child, "scheduled-collector", schedule="* * * * *")
    http.post(ADMIT, json=record, headers=FLEET).raise_for_status()
    dispatch = TaskDispatch(message_id=f"msg-{child}", child_id=child, kind="scheduled-collector", prompt="true",
                        schedule=schedule)  # fmt: skip
    response = http.post(SEND, json=build_message(dispatch).wire(), headers=EXECUTOR)
    assert_json_error(response, 422, "executor.invalid_schedule")


# --- 5. faults that are the substrate's own -------------------------------------------------------


async def test_5_an_internal_fault_is_a_logged_json_500(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Without its lifespan the app has no services: a fault of the substrate, not of the input.
    app = create_app(substrate_config(tmp_path))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://substrate") as client:
        with caplog.at_level(logging.ERROR, logger="substrate.app"):
            response = await client.get("/api/v2/fleet/workloads", headers=FLEET)
    assert_json_error(response, 500, "substrate.internal_error")
    [logged] = [r for r in caplog.records if r.name == "substrate.app"]
    assert logged.exc_info is not None and "GET /api/v2/fleet/workloads" in logged.getMessage()


# --- properties -----------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(10**80), 10**80), st.floats(allow_nan=True),
    st.text(max_size=30), st.sampled_from(["Bearer x", JWT, "AKIAIOSFODNN7EXAMPLE", "\x00", "\ud800", "* * * * *"]),
)  # fmt: skip
_keys = st.one_of(st.text(max_size=10), st.sampled_from(["token", "authorization", "status", "message", "parts"]))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
                     max_leaves=20)  # fmt: skip
_CONTENT_TYPES = st.sampled_from([None, "application/json", "text/plain", "application/json; charset=latin-1",
                                  "application/octet-stream", "", "application/problem+json"])  # fmt: skip
_ROUTES = st.sampled_from([*BODY_ROUTES, (f"{ADMIT}/door-obs/observations", FLEET, "fleet.invalid_observation"),
                           ("/agents/local-2/v1/messages:send", EXECUTOR, "executor.invalid_message")])  # fmt: skip


def _dumps(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


def _bases(finished: str) -> list[tuple[str, dict[str, str], Any]]:
    observation = {"expected_revision": 1, "status": {"observed_state": "running", "revision": 2,
                   "last_seen": "2026-08-02T15:00:00Z", "artifacts": []}}  # fmt: skip
    return [
        (ADMIT, FLEET, record_dict("door-prop", "daemon")),
        (f"{ADMIT}/door-obs/observations", FLEET, observation),
        ("/api/v2/fleet/reconcile", FLEET, {"before_revision": 0, "child_ids": ["door-kept", "door-none"]}),
        (SEND, EXECUTOR, message(finished)),
    ]


def _locations(value: Any, loc: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield loc
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _locations(item, (*loc, key))


def _mutate(document: Any, data: st.DataObject) -> Any:
    document = copy.deepcopy(document)
    loc = data.draw(st.sampled_from(list(_locations(document))))
    if not loc:
        return data.draw(_json)
    parent = document
    for part in loc[:-1]:
        parent = parent[part]
    operation = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if operation == "replace":
        parent[loc[-1]] = data.draw(_json)
    elif operation == "delete":
        del parent[loc[-1]]
    elif isinstance(parent, dict):
        parent[data.draw(_keys)] = data.draw(_json)
    return document


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        assert_json_error(response, response.status_code)


def assert_no_faults(caplog: pytest.LogCaptureFixture) -> None:
    """No traceback either: nothing the substrate logged as an error (its catch-all, its runner)."""
    faults = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("substrate")]
    assert not faults, [r.getMessage() for r in faults]


@pytest.fixture(scope="module")
def observed(http: httpx.Client) -> str:
    http.post(ADMIT, json=record_dict("door-obs"), headers=FLEET).raise_for_status()
    return "door-obs"


_PROPERTY = settings(max_examples=120, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


@_PROPERTY
@given(route=_ROUTES, body=st.binary(max_size=300), content_type=_CONTENT_TYPES)
def test_random_bytes_never_get_a_5xx(
    http: httpx.Client, kept: dict[str, Any], observed: str, caplog: pytest.LogCaptureFixture, route: Any,
    body: bytes, content_type: str | None,
) -> None:
    path, auth, _ = route
    headers = auth if content_type is None else {**auth, "Content-Type": content_type}
    _check(http.post(path, content=body, headers=headers))
    assert_kept(http, kept)
    assert_no_faults(caplog)


@_PROPERTY
@given(route=_ROUTES, value=_json)
def test_json_of_every_shape_never_gets_a_5xx(
    http: httpx.Client, kept: dict[str, Any], observed: str, caplog: pytest.LogCaptureFixture, route: Any,
    value: Any,
) -> None:
    path, auth, _ = route
    _check(http.post(path, content=_dumps(value), headers=auth))
    assert_kept(http, kept)
    assert_no_faults(caplog)


@_PROPERTY
@given(data=st.data())
def test_mutated_documents_never_get_a_5xx(
    http: httpx.Client, kept: dict[str, Any], observed: str, finished: str, caplog: pytest.LogCaptureFixture,
    data: st.DataObject,
) -> None:
    path, auth, base = data.draw(st.sampled_from(_bases(finished)))
    document = base
    for _ in range(data.draw(st.integers(1, 3))):
        document = _mutate(document, data)
    _check(http.post(path, content=_dumps(document), headers=auth))
    assert_kept(http, kept)
    assert_no_faults(caplog)


@_PROPERTY
@given(child_id=st.text(min_size=1, max_size=300), task_id=st.text(min_size=1, max_size=40))
def test_odd_ids_in_paths_never_get_a_5xx(
    http: httpx.Client, kept: dict[str, Any], caplog: pytest.LogCaptureFixture, child_id: str, task_id: str
) -> None:
    child, task = quote(child_id, safe=""), quote(task_id, safe="")
    _check(http.get(f"{ADMIT}/{child}", headers=FLEET))
    _check(http.post(f"{ADMIT}/{child}/observations", json={"expected_revision": 0}, headers=FLEET))
    _check(http.get(f"/agents/{child}/v1/tasks/{task}", headers=EXECUTOR))
    _check(http.post(f"/agents/local-1/v1/tasks/{task}/cancel", headers=EXECUTOR))
    assert_kept(http, kept)
    assert_no_faults(caplog)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=_ROUTES, extra=st.integers(1, 64 << 20), chunked_body=st.booleans(), prefix=st.binary(max_size=2000))
def test_oversize_bodies_are_413_at_every_route(
    server: RunningSubstrate, http: httpx.Client, kept: dict[str, Any], route: Any, extra: int,
    chunked_body: bool, prefix: bytes,
) -> None:
    path, auth, _ = route
    if chunked_body:
        head = request_head(path, {**auth, "Transfer-Encoding": "chunked"})
        payload = (prefix + b" " * (DEFAULT_MAX_REQUEST_BYTES + 1))[: DEFAULT_MAX_REQUEST_BYTES + 1]
        status, headers, body, _ = exchange(server, head, chunked(payload))
    else:
        head = request_head(path, {**auth, "Content-Length": str(DEFAULT_MAX_REQUEST_BYTES + extra)})
        status, headers, body, _ = exchange(server, head, prefix)
    assert (status, headers["content-type"]) == (413, "application/json")
    assert json.loads(body)["error"] == "http.payload_too_large"
    assert_kept(http, kept)
