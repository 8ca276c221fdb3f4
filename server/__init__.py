"""ucudnn.server: the plan service (FastAPI + uvicorn). Installed as ``ucudnn.server``."""
