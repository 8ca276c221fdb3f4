"""Alembic revision files, one per schema change (see ``ucudnn.server.migrations``)."""
