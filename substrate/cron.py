"""A small, exact 5-field cron matcher for scheduled collectors (evaluated in UTC).

Why not `croniter`: we need one thing (the next minute a standard 5-field expression fires),
it is about a hundred lines to do exactly, and a dependency would add a moving part (its
maintenance changed hands in 2024) plus a shared `pyproject.toml` edit for every user of
the substrate. The semantics follow Vixie cron:

- fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or jan-dec),
  day of week (0-7 or sun-sat; 0 and 7 are Sunday);
- each field is a comma list of `*`, `N`, `N-M`, each optionally `/STEP`;
- when both day fields are restricted (neither starts with `*`) a day matches if EITHER
  matches; otherwise only the restricted one counts;
- macros `@yearly` `@annually` `@monthly` `@weekly` `@daily` `@midnight` `@hourly`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name: i + 1 for i, name in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
_DAYS = {name: i for i, name in enumerate("sun mon tue wed thu fri sat".split())}
# Far enough for any satisfiable expression (Feb 29 on a given weekday recurs within 28 years).
_SEARCH_YEARS = 30


class CronError(ValueError):
    """An expression that is not valid 5-field cron, or that never fires."""


def _value(text: str, low: int, high: int, names: dict[str, int], field: str) -> int:
    token = text.lower()
    if token in names:
        return names[token]
    if not (token.isascii() and token.isdigit()) or len(token) > 9:
        raise CronError(f"{field}: {text[:20]!r} is not a number" + (" or a name" if names else ""))
    number = int(token)
    if not low <= number <= high:
        raise CronError(f"{field}: {number} is outside {low}-{high}")
    return number


def _field(text: str, low: int, high: int, names: dict[str, int], field: str) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{field}: empty list item in {text!r}")
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not (step_text.isascii() and step_text.isdigit()) or len(step_text) > 9 or int(step_text) == 0:
                raise CronError(f"{field}: step {step_text[:20]!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _value(first, low, high, names, field)
            end = _value(last, low, high, names, field)
            if start > end:
                raise CronError(f"{field}: range {base!r} runs backwards")
        else:
            start = _value(base, low, high, names, field)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, expression: str) -> CronSchedule:
        text = _MACROS.get(expression.strip().lower(), expression)
        fields = text.split()
        if len(fields) != 5:
            raise CronError(
                f"{expression!r} has {len(fields)} fields; expected 5 (minute hour day-of-month month day-of-week)"
            )
        minute, hour, day, month, weekday = fields
        weekdays = _field(weekday, 0, 7, _DAYS, "day of week")
        schedule = cls(
            expression=expression,
            minutes=_field(minute, 0, 59, {}, "minute"),
            hours=_field(hour, 0, 23, {}, "hour"),
            days=_field(day, 1, 31, {}, "day of month"),
            months=_field(month, 1, 12, _MONTHS, "month"),
            weekdays=frozenset(d % 7 for d in weekdays),
            days_restricted=not day.startswith("*"),
            weekdays_restricted=not weekday.startswith("*"),
        )
        schedule.next_after(datetime(2000, 1, 1, tzinfo=UTC))  # refuses expressions that never fire
        return schedule

    def _day_matches(self, moment: datetime) -> bool:
        day_ok = moment.day in self.days
        weekday_ok = (moment.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return day_ok or weekday_ok
        return day_ok and weekday_ok

    def matches(self, moment: datetime) -> bool:
        moment = moment.astimezone(UTC)
        return (
            moment.minute in self.minutes
            and moment.hour in self.hours
            and moment.month in self.months
            and self._day_matches(moment)
        )

    def next_after(self, moment: datetime) -> datetime:
        """The first whole minute strictly after `moment` at which the schedule fires (UTC)."""
        if moment.tzinfo is None:
            raise ValueError("next_after needs an aware datetime")
        current = moment.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = current.replace(year=current.year + _SEARCH_YEARS, month=1, day=1)
        while current < limit:
            if current.month not in self.months:
                year, month = (current.year + 1, 1) if current.month == 12 else (current.year, current.month + 1)
                current = current.replace(year=year, month=month, day=1, hour=0, minute=0)
            elif not self._day_matches(current):
                current = (current + timedelta(days=1)).replace(hour=0, minute=0)
            elif current.hour not in self.hours:
                current = (current + timedelta(hours=1)).replace(minute=0)
            elif current.minute not in self.minutes:
                current += timedelta(minutes=1)
            else:
                return current
        raise CronError(f"{self.expression!r} never fires")
