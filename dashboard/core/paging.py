"""Pages of rows keyed by a time-ordered id: fetch one row more than the page, so the answer knows whether
another page follows, and that page's cursor is the last id shown."""

from __future__ import annotations

from dashboard.core.extensions import db


def by_id(query, id_column, limit: int, cursor: str | None, *, newest_first: bool = True) -> tuple[list, str | None]:
    """A page after `cursor` (the previous page's last id), newest or oldest first; returns the rows and the
    next page's cursor (None on the last page)."""
    if cursor:
        query = query.where(id_column < cursor if newest_first else id_column > cursor)
    rows = db.session.scalars(query.order_by(id_column.desc() if newest_first else id_column)
                              .limit(limit + 1)).all()
    page = rows[:limit]
    return page, getattr(page[-1], id_column.key) if len(rows) > limit else None
