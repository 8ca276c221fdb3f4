"""64-bit plan workspace sizes, and the service's benchmark jobs.

PostgreSQL's INTEGER is 32-bit, and workspaces above 2 GiB are common on
80 GB GPUs, so ``plans.workspace_limit``/``total_workspace`` become BIGINT.
SQLite's INTEGER is already 64-bit: nothing to change there (and no table
rebuild on every user's cache).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        for col in ("workspace_limit", "total_workspace"):
            op.alter_column("plans", col, type_=sa.BigInteger, existing_type=sa.Integer, existing_nullable=True)
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("done", sa.Integer, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("message", sa.Text, nullable=True),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("table_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("jobs")
    if op.get_bind().dialect.name != "sqlite":
        for col in ("workspace_limit", "total_workspace"):
            op.alter_column("plans", col, type_=sa.Integer, existing_type=sa.BigInteger, existing_nullable=True)
