"""Rate-limit windows: calendar days, months and years, starting at UTC midnight."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kronk_auth_jwt.tokens import Window


def window_bounds(window: Window, now: datetime) -> tuple[datetime, datetime]:
    """The [start, end) of the window that holds `now` (an aware datetime)."""
    now = now.astimezone(UTC)
    if window == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + timedelta(days=1)
    elif window == "month":
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        year, month = divmod(start.month, 12)
        end = start.replace(year=start.year + year, month=month + 1)
    else:
        start = now.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
        end = start.replace(year=start.year + 1)
    return start, end
