"""The service's routes, one module per resource (FastAPI's "bigger applications" layout)."""
