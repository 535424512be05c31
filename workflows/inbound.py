"""The workflows' own front door: every argument a client sends a workflow comes in here.

Missions are started and driven by clients in any language (the `temporal` CLI, TypeScript's
`@temporalio/client`, our own CLI), and none of them runs our pydantic models first. Left to the
SDK, an argument that does not decode fails the workflow *task*, which the server retries for ever:
the run shows `Running` and its client waits for good. So no workflow entry point here names its
argument's type to the SDK. Each takes `*args` (the worker's converter, `worker.payloads`, hands
them over as plain JSON data, or as `workflows.json_input.Unreadable`) and validates them here:

- a workflow's input that does not validate fails the run at once, with a non-retryable
  `ApplicationError` of type `InvalidInput` (`workflows.failures.refused_start`) whose message
  names every wrong field and where to look the right one up;
- an update's argument is checked by its validator, so a bad one is rejected before it reaches
  history and its sender reads why;
- a signal's argument that does not validate is recorded as a `Refusal` (the workflow changes
  nothing else and runs on), where operators see it;
- a query's argument that does not validate fails that query, with the same words.

The JSON rules are the CLI's own (`workflows.json_input`), so what `conductor` refuses, every
other client is refused too. Pure (no Temporal in it): imported by workflow code, the pure cores
(`Refusal`) and the CLI alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from workflows.contract import json_path
from workflows.json_input import Unreadable, one_line

# Refused signals a workflow keeps for operators: the most recent ones (the log has every one).
MAX_REFUSALS_KEPT = 20
MAX_PROBLEMS_SHOWN = 10

Model = TypeVar("Model")


class Refused(ValueError):
    """An argument that cannot be used; the message is one line: what, what is wrong, where to look."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class Refusal(BaseModel):
    """A signal a workflow received and did not act on, and why (kept for operators)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: datetime
    signal: str
    reason: str = Field(max_length=4000)


def argument(args: Sequence[Any], rule: type[Model] | TypeAdapter[Model], what: str, *, hint: str = "") -> Model:
    """The one argument `args` must hold, validated by `rule` (a pydantic model or a TypeAdapter); Refused
    otherwise. `what` names it in the message ("MissionWorkflow's input"), `hint` says where its
    shape is published."""
    if len(args) != 1:
        raise Refused(f"{what} takes exactly one argument, a JSON value; {len(args)} were sent{_see(hint)}")
    return _validate(args[0], rule, what, hint)


def signal_argument(
    args: Sequence[Any], rule: type[Model] | TypeAdapter[Model], signal: str, refuse: Callable[[str, Refused], None],
    *, hint: str = "",
) -> Model | None:
    """A signal's one argument, or None when it is refused: `refuse(signal, refusal)` records why
    (a signal has no answer, so the workflow keeps what it refused where operators look)."""
    try:
        return argument(args, rule, f"the {signal} signal's argument", hint=hint)
    except Refused as refused:
        refuse(signal, refused)
        return None


def optional_argument(args: Sequence[Any], rule: type[Model] | TypeAdapter[Model], default: Model, what: str) -> Model:
    """Like `argument`, for one that may be left out (a query's limit)."""
    if not args:
        return default
    return argument(args, rule, what)


def no_argument(args: Sequence[Any], what: str) -> None:
    if args:
        raise Refused(f"{what} takes no argument; {len(args)} were sent: send it without input")


def _validate(value: Any, rule: type[Model] | TypeAdapter[Model], what: str, hint: str) -> Model:
    if isinstance(value, Unreadable):
        raise Refused(f"{what} {value.why}{_see(hint)}")
    if isinstance(rule, type) and issubclass(rule, BaseModel) and not isinstance(value, dict):
        raise Refused(f"{what} must be a JSON object, not {_json_kind(value)}{_see(hint)}")
    try:
        if isinstance(rule, TypeAdapter):
            return rule.validate_python(value)
        return rule.model_validate(value)  # type: ignore[union-attr]
    except ValidationError as error:
        raise Refused(f"{what} is not valid: {describe(error)}{_see(hint)}") from None


def problems(error: ValidationError) -> list[str]:
    """Each problem as `where: what` (the field's JSON path), in the CLI's words."""
    found = []
    for item in error.errors():
        where = json_path(item["loc"]).removeprefix("$").removeprefix(".")
        message = item["msg"].removeprefix("Value error, ")
        found.append(f"{where}: {message}" if where else message)
    return found


def describe(error: ValidationError) -> str:
    return joined(problems(error))


def joined(found: Sequence[str]) -> str:
    """Problems on one line, the first MAX_PROBLEMS_SHOWN of them (a terminal or a log shows it whole)."""
    shown = "; ".join(found[:MAX_PROBLEMS_SHOWN])
    if len(found) > MAX_PROBLEMS_SHOWN:
        shown += f"; and {len(found) - MAX_PROBLEMS_SHOWN} more"
    return shown


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bytes):
        return "raw bytes (payload encoding binary/plain): send JSON (payload encoding json/plain)"
    if hasattr(value, "DESCRIPTOR"):
        return "a protobuf message: send JSON (payload encoding json/plain)"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _see(hint: str) -> str:
    return f"; {hint}" if hint else ""
