"""A delivery's page: what was sent, and every attempt."""

from __future__ import annotations

from flask import abort, render_template
from flask_login import current_user, login_required

from .. import access
from ..extensions import db
from ..models import Delivery
from . import bp


@bp.get("/deliveries/<delivery_id>")
@login_required
def delivery(delivery_id):
    d = db.session.get(Delivery, delivery_id)
    if d is None or not access.can_view(current_user, d.subscription):
        abort(404)
    return render_template("deliveries/page.html", d=d, sub=d.subscription,
                           can_operate=access.can_operate(current_user, d.subscription))
