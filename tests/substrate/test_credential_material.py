"""The one credential-material detector (workflows/credential_material.py), and the boundaries that use it.

Keys are matched as whole words of the normalised key; values by the shape of a credential, so a
shell command may mention a token or use `$TOKEN` but not carry one.
"""

from __future__ import annotations

import base64
import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.substrate_support import record_dict
from workflows.contract import ContractError, find_credential_keys, parse_document
from workflows.credential_material import (
    credential_paths,
    find_credential_material,
    is_credential_key,
    value_credential_kind,
)
from workflows.mission.spec import MissionSpec

# --- keys -------------------------------------------------------------------------------------------

CREDENTIAL_KEYS = [
    # what the contract always refused
    "credential", "credentials", "secret", "secrets", "password", "token", "private_key", "access_key", "api_key",
    "github_token", "db-password", "PASSWORD", "Api-Key", "client_secret", "aws_access_key_id", "githubToken",
    "apiKey", "APIKey", "privateKey", "apikey", "token_count", "session_token",
    # what the hostile test sent, and its relatives
    "authorization", "Authorization", "Proxy-Authorization", "bearer", "BEARER_TOKEN", "bearerToken", "cookie",
    "Set-Cookie", "cookies", "jwt", "idToken", "refresh_token", "accessToken", "x-api-key", "X-Auth-Token",
    "client-secret", "clientSecret", "secret_key", "signingKey", "passwd", "passphrase", "dbpassword",
    "githubtoken", "SECRET", "api.key", "auth tokens", "OAuthToken", "token_budget",
]  # fmt: skip
NON_CREDENTIAL_KEYS = [
    "credential_policy_ref", "network_policy_ref", "CREDENTIAL_POLICY_REF", "credentialPolicyRef",
    "credential-policy-ref", "max_tokens", "tokens_budget", "tokenizer", "secretary", "passwords_rotated_at",
    "api_version", "access_log", "private_network", "key", "keyboard", "session_id", "task_id", "auth_mode",
    "https://agentic-sandbox.aiwg.io/extensions/runtime/v1", "messageId", "contextId", "desired_state",
]  # fmt: skip


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
def test_keys_that_name_a_credential_are_found(key: str) -> None:
    assert is_credential_key(key)
    assert credential_paths({"outer": [{key: "value"}]}) == [
        "$.outer[0]." + key if key.isidentifier() else f"$.outer[0]['{key}']"
    ]


@pytest.mark.parametrize("key", NON_CREDENTIAL_KEYS)
def test_reference_and_lookalike_keys_pass(key: str) -> None:
    assert not is_credential_key(key)
    assert credential_paths({key: {key: "plain"}}) == []


def test_the_contract_alias_keeps_its_key_only_meaning_and_order() -> None:
    value = {"a": {"token": {"password": 1}}, "b": ["Bearer abc123def456"], "secret": "x"}
    assert find_credential_keys(value) == ["$.a.token", "$.a.token.password", "$.secret"]
    assert credential_paths(value) == ["$.a.token", "$.a.token.password", "$.b[0]", "$.secret"]


# --- values -----------------------------------------------------------------------------------------

JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
CREDENTIAL_VALUES = {
    "Bearer x": "a bearer authorization value",
    "bearer abc": "a bearer authorization value",
    "curl -H 'Authorization: Bearer abc' https://api.example": "an Authorization header with a literal credential",
    "curl -H 'authorization:token 1a2b' x": "an Authorization header with a literal credential",
    "wget --header 'X-Thing: Bearer 0123abcdEFGH' x": "a bearer token",
    "Basic dXNlcjpodW50ZXIy": "a Basic authorization value",
    f"echo {JWT} | xargs": "a JWT",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n-----END RSA PRIVATE KEY-----": "a PEM private key",
    "-----BEGIN OPENSSH PRIVATE KEY-----": "a PEM private key",
    "-----BEGIN PGP PRIVATE KEY BLOCK-----": "a PEM private key",
    "aws s3 ls --key AKIAIOSFODNN7EXAMPLE": "an AWS access key id",
    "git clone https://ghp_" + "a1" * 18 + "@github.com/o/r": "a GitHub token",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz": "a GitHub token",
    "glpat-abcdefghij0123456789": "a GitLab token",
    "xoxb-1234567890-abcdefghij": "a Slack token",
    "OPENAI=sk-proj-abcdefghij0123456789 ./x": "a secret API key (sk-...)",
    "sk_live_0123456789abcdefghij": "a Stripe secret key",
    "AIza" + "B" * 35: "a Google API key",
    "npm_" + "a" * 36: "an npm token",
    "hf_" + "a" * 34: "a Hugging Face token",
    "psql postgres://app:s3cret@db:5432/app": "a password inside a URL",
    "DB_PASSWORD=hunter22 ./migrate": "a literal value assigned to a credential-named variable",
    "./deploy --api-key=abc123": "a literal value assigned to a credential-named variable",
    "export GITHUB_TOKEN='abcdef'": "a literal value assigned to a credential-named variable",
}
SAFE_VALUES = [
    "echo token", "rotate the secret", "Bearer tokens never enter workflow inputs", "count the tokens",
    'curl -H "Authorization: Bearer $TOKEN" https://api.example', "curl -H 'Authorization: Bearer ${API_TOKEN}' x",
    "Basic auth is off", "https://u:${PASSWORD}@host/x", 'PGPASSWORD="$PW" psql', "TOKEN_FILE=/run/secrets/t ./x",
    "./run --token-budget=5000", "--max-tokens=512", "pip install scikit-learn sk-video", "risk-assessment-2024-q1",
    "git clone git@github.com:org/repo.git", "https://example.com:8443/a?b=c", "python -c 'print(1)'",
    "the password policy", "eyJ", "AKIA", "ghp_short", "sleep 0.2; echo done", "ssh://git@host/x",
]  # fmt: skip


@pytest.mark.parametrize(("text", "kind"), CREDENTIAL_VALUES.items(), ids=range(len(CREDENTIAL_VALUES)))
def test_values_shaped_like_credentials_are_found(text: str, kind: str) -> None:
    assert value_credential_kind(text) == kind
    [finding] = find_credential_material({"message": {"parts": [{"text": text}]}})
    assert (finding.path, finding.in_key) == ("$.message.parts[0].text", False)
    assert text not in finding.describe()


@pytest.mark.parametrize("text", SAFE_VALUES)
def test_text_that_only_mentions_a_credential_passes(text: str) -> None:
    assert value_credential_kind(text) is None


def test_a_key_is_reported_once_and_what_it_holds_is_still_walked() -> None:
    value = {"authorization": "Bearer x", "headers": {"Cookie": ["a", JWT]}, JWT: 1}
    found = [(f.path, f.in_key, f.what) for f in find_credential_material(value)]
    assert found == [
        ("$.authorization", True, "a key that names a credential"),
        ("$.headers.Cookie", True, "a key that names a credential"),
        ("$.headers.Cookie[1]", False, "a value that looks like a JWT"),
        ("$[<a JWT>]", True, "a key that looks like a JWT"),  # a path never spells out a credential
    ]
    assert credential_paths(value, keys=False) == ["$.authorization", "$.headers.Cookie[1]"]
    assert credential_paths(value, values=False) == ["$.authorization", "$.headers.Cookie"]
    assert credential_paths(value, limit=2) == ["$.authorization", "$.headers.Cookie"]


def test_a_key_shaped_like_a_credential_is_not_echoed_by_the_contract() -> None:
    record = record_dict("cred-key")
    record["spec"][JWT] = 1
    record["spec"]["orchestrator_metadata"] = {"headers": {f"Bearer {JWT}": "v"}}
    with pytest.raises(ContractError) as caught:
        parse_document(record)
    assert sorted(caught.value.issues) == [
        ("$.spec.orchestrator_metadata.headers[<a bearer authorization value>]",
         "credential material must not cross the contract boundary: this is a key that looks like a bearer "
         "authorization value; remove it and name the credential through spec.policy.credential_policy_ref instead"),
        ("$.spec[<a JWT>]",
         "credential material must not cross the contract boundary: this is a key that looks like a JWT; remove it "
         "and name the credential through spec.policy.credential_policy_ref instead"),
    ]  # fmt: skip


def test_input_deeper_than_the_recursion_limit_is_walked() -> None:
    value: Any = "Bearer x"
    for level in range(100_000):
        value = {"k": value} if level % 2 else [value]
    [path] = credential_paths(value)
    assert path.startswith("$.k[0].k[0]") and path.count("[0]") == 50_000


@pytest.mark.parametrize(
    "text",
    ["eyJ" * 100_000, '"\\"' * 100_000, "Bearer " * 50_000, "=a" * 100_000, "://a:" * 60_000, "a" * 300_000,
     "basic " + "A" * 300_000, "x=" * 100_000, "-----BEGIN " * 30_000],
)  # fmt: skip
def test_pathological_text_is_scanned_in_one_pass(text: str) -> None:
    # Quadratic patterns would take minutes here; anchored, possessive ones take milliseconds.
    assert value_credential_kind(text) is None


# --- properties -------------------------------------------------------------------------------------

_SAFE_WORDS = [
    "max", "tokens", "tokenizer", "secretary", "passwords", "rotated", "at", "version", "log", "network",
    "keyboard", "key", "child", "count", "budget", "name", "policy", "ref", "runtime", "target", "lane",
]  # fmt: skip
_CREDENTIAL_PARTS = [
    ["token"], ["secret"], ["password"], ["credential"], ["credentials"], ["authorization"], ["bearer"],
    ["cookie"], ["jwt"], ["passwd"], ["api", "key"], ["access", "key"], ["private", "key"], ["session", "token"],
    ["client", "secret"], ["refresh", "token"],
]  # fmt: skip


def _join(words: list[str], style: str) -> str:
    if style == "snake":
        return "_".join(words)
    if style == "kebab":
        return "-".join(words)
    if style == "upper":
        return "_".join(words).upper()
    if style == "dotted":
        return ".".join(words)
    if style == "camel":
        return words[0] + "".join(word.capitalize() for word in words[1:])
    if style == "pascal":
        return "".join(word.capitalize() for word in words)
    return "".join(words)  # concatenated


_STYLES = st.sampled_from(["snake", "kebab", "upper", "dotted", "camel", "pascal"])
_safe_words = st.lists(st.sampled_from(_SAFE_WORDS), min_size=1, max_size=4)


@st.composite
def credential_keys(draw: st.DrawFn) -> str:
    words = [*draw(st.lists(st.sampled_from(_SAFE_WORDS), max_size=2)), *draw(st.sampled_from(_CREDENTIAL_PARTS))]
    words += draw(st.lists(st.sampled_from(_SAFE_WORDS), max_size=2))
    return _join(words, draw(_STYLES))


@st.composite
def safe_keys(draw: st.DrawFn) -> str:
    return _join(draw(_safe_words), draw(st.one_of(_STYLES, st.just("concatenated"))))


@settings(max_examples=300, deadline=None)
@given(key=credential_keys(), depth=st.integers(0, 4))
def test_generated_credential_keys_are_found_at_any_depth(key: str, depth: int) -> None:
    value: Any = {key: "v"}
    for _ in range(depth):
        value = {"x": [value]}
    assert is_credential_key(key)
    assert credential_paths(value) == [("$" + ".x[0]" * depth) + (f".{key}" if key.isidentifier() else f"['{key}']")]


@settings(max_examples=300, deadline=None)
@given(key=safe_keys())
def test_generated_plain_keys_pass(key: str) -> None:
    assert not is_credential_key(key), key


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


_json_objects = st.dictionaries(
    st.text(string.ascii_letters, min_size=1, max_size=6), st.integers() | st.text(max_size=8), min_size=1, max_size=3
)
_alnum = string.ascii_letters + string.digits


@st.composite
def credentials(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["jwt", "bearer", "basic", "github", "aws", "slack", "sk", "pem", "url", "assign"]))
    text = lambda alphabet, low, high: draw(st.text(alphabet, min_size=low, max_size=high))  # noqa: E731
    if kind == "jwt":
        header, payload = (json.dumps(draw(_json_objects)).encode() for _ in range(2))
        return f"{_b64url(header)}.{_b64url(payload)}.{_b64url(draw(st.binary(max_size=40)))}"
    if kind == "bearer":
        token = text(string.ascii_letters, 1, 8) + text(string.digits, 1, 8) + text(_alnum + "-._~+/", 6, 30)
        return f"Bearer {token}"
    if kind == "basic":
        visible = string.ascii_letters + string.digits + string.punctuation.replace(":", "")
        pair = f"{text(visible, 1, 12)}:{text(visible + ':', 1, 20)}"
        return "Basic " + base64.b64encode(pair.encode()).decode()
    if kind == "github":
        return draw(st.sampled_from(["ghp_", "gho_", "ghs_"])) + text(_alnum, 36, 40)
    if kind == "aws":
        return draw(st.sampled_from(["AKIA", "ASIA"])) + text(string.ascii_uppercase + string.digits, 16, 16)
    if kind == "slack":
        return draw(st.sampled_from(["xoxb-", "xoxp-"])) + text(string.digits, 6, 12) + "-" + text(_alnum, 6, 24)
    if kind == "sk":
        return "sk-" + text(_alnum, 10, 20) + text(string.digits, 1, 3) + text(_alnum + "-_", 9, 20)
    if kind == "pem":
        return f"-----BEGIN {draw(st.sampled_from(['', 'RSA ', 'EC ', 'ENCRYPTED ']))}PRIVATE KEY-----"
    if kind == "url":
        return f"https://{text(string.ascii_lowercase, 1, 8)}:{text(_alnum + '!*', 1, 16)}@db.example/x"
    name = draw(st.sampled_from(["DB_PASSWORD", "API_KEY", "GITHUB_TOKEN", "client_secret", "--api-key", "--password"]))
    return f"{name}={text(string.ascii_letters, 1, 6)}{text(_alnum, 3, 12)}"


_SAFE_PROMPT_WORDS = [
    "token", "tokens", "secret", "secrets", "password", "Bearer", "bearer", "Basic", "JWT", "eyJ", "sk-learn",
    "AKIA", "ghp_", "xoxb", "credential", "$TOKEN", '"$API_KEY"', "${SECRET}", "Authorization: Bearer $TOKEN",
    "https://example.com/path", "--max-tokens=512", "TOKEN_FILE=/run/secrets/token", "token_budget=5000",
    'PGPASSWORD="$PW"', "|", "&&", ";", "2>&1", "-v", "x", "1", "42", "rotate", "the", "print", "and",
]  # fmt: skip
_COMMANDS = ["echo", "curl", "sh -c", "python3 -m tool", "./run.sh", "grep -r"]


@st.composite
def safe_prompts(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.sampled_from(_SAFE_PROMPT_WORDS), max_size=12))
    return " ".join([draw(st.sampled_from(_COMMANDS)), *words])


@settings(max_examples=400, deadline=None)
@given(prompt=safe_prompts())
def test_generated_commands_that_mention_credentials_pass(prompt: str) -> None:
    assert value_credential_kind(prompt) is None, prompt


@settings(max_examples=400, deadline=None)
@given(before=safe_prompts(), secret=credentials(), after=st.lists(st.sampled_from(_SAFE_PROMPT_WORDS), max_size=4))
def test_generated_credentials_are_found_inside_commands(before: str, secret: str, after: list[str]) -> None:
    prompt = " ".join([before, secret, *after])
    assert value_credential_kind(prompt) is not None, prompt
    findings = find_credential_material({"spec": {"prompt": prompt}})
    assert [f.path for f in findings] == ["$.spec.prompt"]
    assert secret not in " ".join(f.describe() for f in findings)


# --- the boundaries -------------------------------------------------------------------------------


def test_the_contract_refuses_credential_values_without_echoing_them() -> None:
    record = record_dict("cred-value")
    record["spec"]["orchestrator_metadata"] = {"conductor": {"note": JWT}}
    record["lineage"]["dispatch_id"] = "AKIAIOSFODNN7EXAMPLE"
    with pytest.raises(ContractError) as caught:
        parse_document(record)
    issues = dict(caught.value.issues)
    assert issues["$.spec.orchestrator_metadata.conductor.note"].startswith(
        "credential material must not cross the contract boundary: this is a value that looks like a JWT"
    )
    assert "AWS access key" in issues["$.lineage.dispatch_id"]
    assert JWT not in str(caught.value) and "AKIAIOSFODNN7EXAMPLE" not in str(caught.value)


def _spec(**child: object) -> dict[str, Any]:
    return {
        "mission_id": "m-cred",
        "orchestrator_id": "o-cred",
        "goal": "count the tokens in every log",
        "children": [{"child_id": "c1", "kind": "one-shot-command", "prompt": "echo token", **child}],
    }


@pytest.mark.parametrize(
    "prompt",
    ['curl -H "Authorization: Bearer $TOKEN" https://api.example', "echo token; wc -w tokens.txt",
     "PGPASSWORD=\"$PW\" psql -c 'select 1'", "./run --max-tokens=100"],
)  # fmt: skip
def test_a_mission_spec_may_mention_and_reference_credentials(prompt: str) -> None:
    assert MissionSpec.model_validate(_spec(prompt=prompt)).children[0].prompt == prompt


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"prompt": "curl -H 'Authorization: Bearer abc123xyz' https://api.example"}, "children[0].prompt"),
        ({"prompt": f"echo {JWT}"}, "children[0].prompt"),
        ({"verifier": "test $(curl -s https://u:hunter22@host/ok) = ok"}, "children[0].verifier"),
        ({"environment": "AKIAIOSFODNN7EXAMPLE"}, "children[0].environment"),
        ({"lane": "Bearer x"}, "children[0].lane"),
    ],
)
def test_a_mission_spec_refuses_literal_credentials_in_free_form_fields(change: dict[str, str], where: str) -> None:
    with pytest.raises(ValueError) as caught:
        MissionSpec.model_validate(_spec(**change))
    [error] = caught.value.errors()  # type: ignore[attr-defined]
    message = error["msg"]
    assert f"{where}: a value that looks like" in message
    assert "worker's environment" in message
    assert next(iter(change.values())) not in message


def test_a_mission_goal_with_a_credential_is_refused() -> None:
    spec = {**_spec(), "goal": f"use {JWT}"}
    with pytest.raises(ValueError, match=r"goal: a value that looks like a JWT"):
        MissionSpec.model_validate(spec)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=safe_prompts(), secret=credentials())
def test_mission_specs_take_safe_commands_and_refuse_embedded_credentials(prompt: str, secret: str) -> None:
    MissionSpec.model_validate(_spec(prompt=prompt))
    with pytest.raises(ValueError, match="credential material must not be put in a mission spec"):
        MissionSpec.model_validate(_spec(prompt=f"{prompt} {secret}"))


def test_only_clean_keys_are_remembered_so_a_credential_key_is_refused_every_time() -> None:
    from workflows import credential_material

    jwt_key = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
    document = {"plain_field": 1, "github_token": "x", jwt_key: 2}
    for _ in range(2):  # the second walk finds the same: nothing found once is skipped later
        found = {finding.path: finding.what for finding in find_credential_material(document)}
        assert found == {"$.github_token": "a key that names a credential", "$[<a JWT>]": "a key that looks like a JWT"}
    # What the detector remembers between requests holds no key that names or looks like a credential.
    assert {"github_token", jwt_key}.isdisjoint(credential_material._CLEAN_KEYS)


def test_a_key_checked_by_name_only_is_still_checked_for_its_text_later() -> None:
    key = "AKIAABCDEFGHIJKLMNOP"  # names nothing, but its text looks like an AWS access key id
    assert find_credential_material({key: 1}, values=False) == []
    assert [finding.what for finding in find_credential_material({key: 1})] == ["a key that looks like an AWS access key id"]
