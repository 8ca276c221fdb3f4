"""What the service refuses before any handler runs: oversized bodies and non-finite JSON numbers.

* Bodies above the limit (default 16 MiB) get 413 — from ``Content-Length``
  before reading anything, or while reading a chunked body.
* Python's ``json`` accepts ``NaN`` and ``Infinity``; no interchange format
  allows them (tables are written with ``allow_nan=False``) and a NaN time
  would poison every plan, so request bodies are parsed refusing them: 422
  ``json_invalid`` like any other malformed JSON.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Coroutine

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ucudnn.units import format_size

DEFAULT_MAX_BODY_BYTES = 16 << 20


class BodyTooLarge(HTTPException):
    """Raised while a body is read: FastAPI re-raises HTTPExceptions, so this becomes a 413, not a 400."""

    def __init__(self, limit: int, size: int | None = None):
        got = f"{size} bytes" if size is not None else "more than that"
        super().__init__(413, f"request body is {got}; this server accepts at most {format_size(limit)}")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    await _send_json(send, 400, {"detail": "Content-Length is not a number", "field": "Content-Length"})
                    return
                if size > self.max_bytes:
                    await _send_json(send, 413, {"detail": BodyTooLarge(self.max_bytes, size).detail, "field": "(body)"})
                    return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not allowed: numbers must be finite", name, 0)


def loads_finite(body: bytes) -> Any:
    """``json.loads`` refusing NaN/Infinity; every failure is a JSONDecodeError (FastAPI: 422 json_invalid)."""
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except json.JSONDecodeError:
        raise
    except UnicodeDecodeError as e:  # FastAPI would answer these two with a field-less 400
        raise json.JSONDecodeError(f"the body is not UTF-8 ({e.reason} at byte {e.start})", "", 0) from None
    except RecursionError:
        raise json.JSONDecodeError("the body nests too deeply", "", 0) from None


def parse_body(body: bytes, model: type[BaseModel]) -> Any:
    """A JSON body validated by ``model``, failing exactly as FastAPI's own body parameters do."""
    try:
        doc = loads_finite(body) if body else None
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}]) from None
    if doc is None and not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


class FiniteJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_finite(await self.body())
        return self._json


class FiniteJSONRoute(APIRoute):
    """An APIRoute whose JSON bodies may not contain NaN / Infinity (FastAPI's documented custom-route hook)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def finite_json_handler(request: Request) -> Response:
            return await handler(FiniteJSONRequest(request.scope, request.receive))

        return finite_json_handler
