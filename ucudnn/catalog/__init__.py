"""Where measured tables and plans are kept and found again.

* :mod:`.store` — the SQL store (SQLite by default, PostgreSQL for the server), migrated with Alembic.
* :mod:`.bundle` — read-only store files shipped beside a model or installed for a cluster.
* :mod:`.client` — the plan service's typed HTTP client.
* :mod:`.lookup` — the chain a first call walks: in-process, user cache, plan server, bundles, then benchmark.
"""
