"""The v1 schema: benchmark tables, plans and the library's kernel benchmark cache.

Exactly what the first release's ``Base.metadata.create_all`` made, so a
store it created is at this revision (and is stamped so when first opened).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "benchmark_tables",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("device", sa.String(256), nullable=False, index=True),
        sa.Column("cudnn_version", sa.Integer, nullable=False, index=True),
        sa.Column("numerics", sa.String(64), nullable=True),
        sa.Column("kernels", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_table(
        "plans",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("table_id", sa.String(64), nullable=True, index=True),
        sa.Column("device", sa.String(256), nullable=False, index=True),
        sa.Column("cudnn_version", sa.Integer, nullable=False, index=True),
        sa.Column("policy", sa.String(16), nullable=False),
        sa.Column("batch_policy", sa.String(16), nullable=False),
        sa.Column("workspace_limit", sa.Integer, nullable=True),
        sa.Column("total_workspace", sa.Integer, nullable=True),
        sa.Column("total_time_ms", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_table(
        "kernel_benches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("device", sa.String(256), nullable=False, index=True),
        sa.Column("cudnn_version", sa.Integer, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("kernel_benches")
    op.drop_table("plans")
    op.drop_table("benchmark_tables")
