"""Plan rows' batch-policy names up to 32 characters.

``plans.batch_policy`` was VARCHAR(16), shorter than ``powerOfTwoAndMidpoints`` (22) and
``powerOfTwoAndEvenSplits`` (23, the library's default policy since session 17): PostgreSQL refused such plans
(the service answered 500), SQLite does not enforce the length.  So on PostgreSQL the column becomes
VARCHAR(32); SQLite needs nothing (and no table rebuild on every user's cache).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("plans", "batch_policy", type_=sa.String(32), existing_type=sa.String(16),
                        existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("plans", "batch_policy", type_=sa.String(16), existing_type=sa.String(32),
                        existing_nullable=False)
