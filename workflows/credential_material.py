"""The one detector of credential material: keys that name a credential, values that look like one.

Every boundary that must keep secrets out uses this module: the Fleet Workload contract
(`workflows.contract`), the mission spec (`workflows.mission.spec`), and the substrate's fleet
admission, observations and A2A `messages:send`. A secret that must reach a workload travels
through the worker's (or the executor's) environment and is named by reference
(`spec.policy.credential_policy_ref`), never by value.

Keys. A key is split into words on every non-alphanumeric character and on camelCase humps
(`githubToken` -> github, token; `APIKey` -> API, Key; `db-password` -> db, password), lowercased,
and refused when
- a word is a credential word (`token`, `secret(s)`, `password`, `passwd`, `passphrase`,
  `credential(s)`, `authorization`, `bearer`, `cookie(s)`, `jwt`, ...) or a known compound
  (`apikey`, `accesstoken`, `clientsecret`, ...), or a word ends in one (`dbpassword`,
  `githubtoken`; no English word ends in these, `passwords` and `tokens` do not);
- two adjacent words form a credential pair (`api key`, `access key`, `private key`, `signing
  key`, `auth tokens`, ...).
Matching is by whole words, so `tokenizer`, `max_tokens`, `secretary`, `passwords_rotated_at`,
`keyboard` and `api_version` pass. The rule is deliberately fail-closed on the singular words:
`token_count` and `token_budget` are refused (the contract has refused `token_count` from the
start); name counters and budgets in the plural (`max_tokens`, `tokens_budget`). The reference
keys `credential_policy_ref` and `network_policy_ref`, in any spelling (`credentialPolicyRef`),
name a policy, not material, and pass.

Values. A string (a value or a key) is refused when it contains something shaped like a
credential: an HTTP authorization value (the whole string `Bearer <token68>`, an embedded
`Bearer <token>` whose token has a letter, a digit and at least 8 characters, an
`Authorization: <scheme> <literal>` header, `Basic <base64 of user:password>`), a JWT, a PEM
private key block, a URL with a password (`scheme://user:pass@`), a shell assignment of a
literal to a credential-named variable (`DB_PASSWORD=hunter22`, `--api-key=abc123`), or a
well-known API key format (AWS `AKIA`/`ASIA` ids, GitHub `ghp_`/`github_pat_`, GitLab `glpat-`,
Slack `xox?-`, `sk-` secret keys, Stripe `sk_live_`, Google `AIza`, npm, Hugging Face). A value
that only mentions a word (`echo token`, `rotate the secret`, `Bearer tokens`) or refers to the
environment (`Authorization: Bearer $TOKEN`, `https://u:${PASS}@host`, `PGPASSWORD="$PW"`)
passes: a child's prompt is a shell command and that is how it should use a secret.

Findings name JSON paths (`$.message.metadata.authorization`) and what was found, never the
offending text. The walk is iterative, so input nested deeper than Python's recursion limit is
fine, and every pattern is anchored so a scan stays linear in the input's length.

Pure stdlib and side-effect free: imported inside the Temporal workflow sandbox.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

__all__ = [
    "ALLOWED_REF_KEYS",
    "Finding",
    "Loc",
    "credential_paths",
    "find_credential_material",
    "is_credential_key",
    "json_path",
    "key_words",
    "value_credential_kind",
]

Loc = tuple[Union[int, str], ...]

# References to credentials are how a workload names what it needs without carrying it.
ALLOWED_REF_KEYS = frozenset({"credential_policy_ref", "network_policy_ref"})
_ALLOWED_REF_WORDS = frozenset(tuple(key.split("_")) for key in ALLOWED_REF_KEYS)

_CREDENTIAL_WORDS = frozenset({
    # the contract's original list
    "credential", "credentials", "secret", "secrets", "password", "token", "privatekey", "accesskey", "apikey",
    # HTTP authorization and sessions
    "authorization", "bearer", "cookie", "cookies", "jwt",
    # other spellings of a password or a key
    "passwd", "passphrase", "secretkey", "apikeys", "apitoken", "apisecret",
    # compounds written as one word
    "accesstoken", "refreshtoken", "authtoken", "sessiontoken", "idtoken", "bearertoken", "csrftoken",
    "xsrftoken", "clientsecret", "privatekeys", "signingkey",
})  # fmt: skip
# A word ending in one of these is a compound too (`dbpassword`, `githubtoken`).
_CREDENTIAL_SUFFIXES = (
    "token", "secret", "password", "passwd", "apikey", "accesskey", "privatekey", "secretkey", "credential",
    "credentials",
)  # fmt: skip
_CREDENTIAL_WORD_PAIRS = frozenset({
    ("private", "key"), ("access", "key"), ("api", "key"), ("secret", "key"), ("signing", "key"),
    ("private", "keys"), ("access", "keys"), ("api", "keys"),
    ("auth", "tokens"), ("access", "tokens"), ("refresh", "tokens"), ("api", "tokens"), ("session", "tokens"),
    ("id", "tokens"),
})  # fmt: skip
# Words of a key: split on any non-alphanumeric and on camelCase humps ("githubToken", "APIKey").
_KEY_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def key_words(name: str) -> list[str]:
    """`"githubToken"` -> `["github", "token"]`; `"X-API-Key"` -> `["x", "api", "key"]`."""
    return [word.lower() for word in _KEY_WORD.findall(name)]


def is_credential_key(name: str) -> bool:
    """True when a key names credential material (`github_token`, `db-password`, `apiKey`, `Authorization`)."""
    words = key_words(name)
    if tuple(words) in _ALLOWED_REF_WORDS:
        return False
    if any(word in _CREDENTIAL_WORDS for word in words):
        return True
    if any(pair in _CREDENTIAL_WORD_PAIRS for pair in zip(words, words[1:])):
        return True
    return any(word.endswith(_CREDENTIAL_SUFFIXES) for word in words)


# --- values ---------------------------------------------------------------------------------------
#
# Every pattern starts with a literal or a negative lookbehind (a match can only begin where a run
# of its characters begins) and uses possessive quantifiers, so no input makes a scan quadratic.
# Where a match is checked further, what is checked sits in a lookahead: a rejected candidate
# ("Basic Basic dXM6cA==") does not swallow the next one.

_TOKEN68 = r"[A-Za-z0-9\-._~+/]++=*+"
_WHOLE_BEARER = re.compile(r"[ \t]*+(?i:bearer)[ \t]++" + _TOKEN68 + r"[ \t]*+")
_BEARER = re.compile(r"(?<![A-Za-z0-9])(?i:bearer)[ \t]{1,16}+(?=(?P<token>" + _TOKEN68 + "))")
_AUTHORIZATION_HEADER = re.compile(
    r"(?i:authorization)[ \t]*+:[ \t]*+(?i:bearer|basic|token|digest|negotiate)[ \t]++[A-Za-z0-9\-._~+/]"
)
_BASIC = re.compile(r"(?<![A-Za-z0-9])(?i:basic)[ \t]{1,16}+(?=(?P<b64>[A-Za-z0-9+/]{4,}+={0,2}+)(?![A-Za-z0-9+/=]))")
_URL_PASSWORD = re.compile(r"://[^\s/:@?#]{1,256}+:(?P<password>[^\s/@?#]{1,256}+)@")
# `NAME=literal`, `--name=literal`; the value may be quoted but must not start with `$` (a reference);
# a number (`--token-budget=5000`) or a path (`TOKEN_FILE=/run/secrets/t`) is not a credential.
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_])(?P<name>[A-Za-z_][A-Za-z0-9_\-]{0,63}+)=(?=[\"']?+(?P<value>[^\s\"'$`;&|<>(){}\\=]{4,}+))"
)
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a JWT", re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{2,}+\.eyJ[A-Za-z0-9_\-]{2,}+\.")),
    ("a PEM private key", re.compile(r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----")),
    ("an AWS access key id", re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])")),
    ("a GitHub token", re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}+|github_pat_[A-Za-z0-9_]{22,}+)")),
    ("a GitLab token", re.compile(r"(?<![A-Za-z0-9_\-])glpat-[A-Za-z0-9_\-]{20,}+")),
    ("a Slack token", re.compile(r"(?<![A-Za-z0-9\-])xox[abposr]-[A-Za-z0-9\-]{10,}+")),
    ("a Stripe secret key", re.compile(r"(?<![A-Za-z0-9_])[sr]k_(?:live|test)_[A-Za-z0-9]{16,}+")),
    ("a Google API key", re.compile(r"(?<![A-Za-z0-9_\-])AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])")),
    ("an npm token", re.compile(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])")),
    ("a Hugging Face token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}+")),
    ("an Authorization header with a literal credential", _AUTHORIZATION_HEADER),
)
_SK_KEY = re.compile(r"(?<![A-Za-z0-9_\-])sk-(?P<key>[A-Za-z0-9_\-]{20,}+)")
_SHORTEST = 8  # no pattern matches fewer characters ("Bearer x")
# Something every pattern needs; most strings (ids, words, plain commands) have none, and one scan says so.
_TRIGGER = re.compile(
    r"(?i:bearer|basic|authorization)|eyJ|-----BEGIN|AKIA|ASIA|gh[pousr]_|github_pat_|glpat-|xox|[sr]k_|AIza"
    r"|npm_|hf_|sk-|://|="
)


def _has_digit(text: str) -> bool:
    return any(char.isdigit() for char in text)


def _has_letter(text: str) -> bool:
    return any(char.isalpha() for char in text)


def _is_basic_credentials(encoded: str) -> bool:
    """`Basic` followed by base64 of `user:password` (printable text with a colon)."""
    if len(encoded) % 4:
        return False
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable()


def value_credential_kind(text: str) -> str | None:
    """What `text` contains that looks like a credential (`"a JWT"`), or None."""
    if len(text) < _SHORTEST or not _TRIGGER.search(text):
        return None
    if _WHOLE_BEARER.fullmatch(text):
        return "a bearer authorization value"
    for kind, pattern in _PATTERNS:
        if pattern.search(text):
            return kind
    for match in _BEARER.finditer(text):
        token = match["token"]
        if len(token) >= 8 and _has_digit(token) and _has_letter(token):
            return "a bearer token"
    for match in _BASIC.finditer(text):
        if _is_basic_credentials(match["b64"]):
            return "a Basic authorization value"
    for match in _SK_KEY.finditer(text):
        if _has_digit(match["key"]):
            return "a secret API key (sk-...)"
    for match in _URL_PASSWORD.finditer(text):
        if match["password"][0] not in "$<{":
            return "a password inside a URL"
    for match in _ASSIGNMENT.finditer(text):
        value = match["value"]
        if is_credential_key(match["name"]) and not value.isdigit() and value[0] not in "/.~":
            return "a literal value assigned to a credential-named variable"
    return None


# Keys found clean (they neither name nor look like a credential), so the walk skips their checks
# next time: keys come from a small vocabulary (every record repeats the contract's field names)
# and the substrate and the worker check every key of every request. Only clean keys are kept, so
# no text that looks like a credential outlives its request here; the set starts over when full.
# It changes no answer, only skips work, so workflow code (which shares this module across runs)
# may use it.
_CLEAN_KEYS: set[str] = set()
_CLEAN_KEYS_KEPT = 4096


def _remember_clean(name: str) -> None:
    if len(_CLEAN_KEYS) >= _CLEAN_KEYS_KEPT:
        _CLEAN_KEYS.clear()
    _CLEAN_KEYS.add(name)


# --- the walk -------------------------------------------------------------------------------------


def json_path(loc: Iterable[int | str]) -> str:
    """`("records", 0, "status", "health")` -> `$.records[0].status.health` (odd keys as `['db-password']`).

    A key that itself looks like a credential is not written out (`$.headers[<a JWT>]`): paths go
    into error messages, logs and workflow histories.
    """
    parts = ["$"]
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif _IDENTIFIER.fullmatch(part) and len(part) < _SHORTEST:
            parts.append(f".{part}")
        elif (kind := value_credential_kind(part)) is not None:
            parts.append(f"[<{kind}>]")
        elif _IDENTIFIER.fullmatch(part):
            parts.append(f".{part}")
        else:
            escaped = part.replace("\\", "\\\\").replace("'", "\\'")
            parts.append(f"['{escaped}']")
    return "".join(parts)


# A location as a linked list (parent, part): pushing a child costs O(1) however deep the input is.
_Node = Union[tuple["_Node", Union[int, str]], None]


def _loc_of(node: _Node) -> Loc:
    parts: list[int | str] = []
    while node is not None:
        node, part = node
        parts.append(part)
    return tuple(reversed(parts))


@dataclass(frozen=True)
class Finding:
    """One piece of credential material: where (`loc`), and what it is, never the text itself."""

    loc: Loc
    what: str
    #: True when the finding is about a key (its name), False when about a value.
    in_key: bool

    @property
    def path(self) -> str:
        return json_path(self.loc)

    def describe(self) -> str:
        """`$.message.metadata.authorization: a key that names a credential`."""
        return f"{self.path}: {self.what}"


_KEY_NAMES_CREDENTIAL = "a key that names a credential"
_VISIT, _REPORT_KEY = 0, 1


def find_credential_material(
    value: object, *, keys: bool = True, values: bool = True, limit: int | None = None
) -> list[Finding]:
    """Credential material anywhere in a JSON-like value, in document order (a key before what it holds).

    `keys` checks key names (and, with `values`, key text that looks like a credential); `values`
    checks strings. `limit` stops after that many findings. Dicts, lists and tuples are walked;
    other leaves are ignored.
    """
    findings: list[Finding] = []
    # (what to do, the item or the key finding's text, where): popped in document order.
    stack: list[tuple[int, object, _Node]] = [(_VISIT, value, None)]
    while stack:
        action, item, node = stack.pop()
        if action == _REPORT_KEY:
            findings.append(Finding(_loc_of(node), str(item), True))
        elif isinstance(item, str):
            kind = value_credential_kind(item) if values else None
            if kind is not None:
                findings.append(Finding(_loc_of(node), f"a value that looks like {kind}", False))
        elif isinstance(item, dict):
            pending: list[tuple[int, object, _Node]] = []
            for key, child in item.items():
                name = str(key)
                child_node: _Node = (node, name)
                named, kind = False, None
                if keys and name not in _CLEAN_KEYS:
                    named = is_credential_key(name)
                    kind = value_credential_kind(name) if values and not named else None
                    if values and not named and kind is None:
                        _remember_clean(name)
                if named or kind is not None:
                    what = _KEY_NAMES_CREDENTIAL if named else f"a key that looks like {kind}"
                    pending.append((_REPORT_KEY, what, child_node))
                    if isinstance(child, str):
                        continue  # the key is reported; its string value adds nothing
                pending.append((_VISIT, child, child_node))
            stack.extend(reversed(pending))
        elif isinstance(item, (list, tuple)):
            stack.extend((_VISIT, child, (node, index)) for index, child in reversed(list(enumerate(item))))
        else:
            continue
        if limit is not None and len(findings) >= limit:
            return findings
    return findings


def credential_paths(value: object, *, keys: bool = True, values: bool = True, limit: int | None = None) -> list[str]:
    """The JSON paths of `find_credential_material`, in order."""
    return [finding.path for finding in find_credential_material(value, keys=keys, values=values, limit=limit)]
