"""Alembic environment: runs on the connection :func:`ucudnn.server.migrations.upgrade` passes in.

Used standalone (``alembic -x url=... upgrade head`` with ``script_location``
pointing here) it opens ``url`` itself.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

config = context.config
connection = config.attributes.get("connection")

if connection is not None:
    context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
else:  # pragma: no cover - manual use
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    engine = create_engine(url)
    with engine.begin() as conn:
        context.configure(connection=conn, render_as_batch=conn.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
