"""`GET /api/v1/openapi.json`: an OpenAPI 3.1 document of section 13, its schemas made from
the msgspec types the API decodes and encodes (types.py), so it cannot drift from them."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from ..version import __version__
from .types import (
    Created,
    CreateSession,
    ErrorBody,
    ResizeBody,
    SessionList,
    SessionStatus,
    SignalBody,
    StreamEvent,
    TargetList,
)

_REF = "#/components/schemas/{name}"
_ERRORS = {"400": "bad_request", "401": "unauthorized", "403": "forbidden or read_only",
           "404": "no_such_session or no_such_target", "409": "session_in_use",
           "413": "a body over its limit",
           "422": "spawn_failed (with errno), or target_unreachable that no retry mends",
           "429": "busy",
           "503": "shutting_down, server_restarting or target_unreachable (with Retry-After)"}


def _json(ref: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def _operation(summary: str, answers: dict[str, Any], body: dict[str, Any] | None = None,
               parameters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    error = _json({"$ref": _REF.format(name="ErrorBody")}, "an error (section 6's code)")
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {**answers, **{status: {**error, "description": meaning}
                                    for status, meaning in _ERRORS.items()}}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": body}
    if parameters:
        operation["parameters"] = parameters
    return operation


@functools.cache
def openapi_document() -> bytes:
    (create, created, listing, status, signal, resize, event, _, targets), components = (
        msgspec.json.schema_components(
            (CreateSession, Created, SessionList, SessionStatus, SignalBody, ResizeBody,
             StreamEvent, ErrorBody, TargetList), ref_template=_REF))
    session_id = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
    no_content = {"204": {"description": "done"}}
    offsets = [{"name": name, "in": "query", "required": False,
                "schema": {"type": "integer", "minimum": 0},
                "description": f"the {name} bytes already held"} for name in ("stdout", "stderr")]
    stream = {"description": "one event a line (NDJSON), or server-sent events with "
                             "`Accept: text/event-stream` (id: STDOUT,STDERR)",
              "content": {"application/x-ndjson": {"schema": event},
                          "text/event-stream": {"schema": event}}}
    paths = {
        "/api/v1/sessions": {
            "post": _operation("start a process (a detachable session)",
                               {"201": _json(created, "started"),
                                "200": _json(created, "started before, same Idempotency-Key")},
                               {"application/json": {"schema": create}}),
            "get": _operation("this principal's sessions", {"200": _json(listing, "list")})},
        "/api/v1/targets": {
            "get": _operation("the targets this principal may open (section 15)",
                              {"200": _json(targets, "targets")})},
        "/api/v1/sessions/{id}": {
            "parameters": [session_id],
            "get": _operation("a session's status; with wait, once it ended or after wait "
                              "seconds", {"200": _json(status, "status")},
                              parameters=[{"name": "wait", "in": "query", "required": False,
                                           "schema": {"type": "number", "minimum": 0,
                                                      "maximum": 300}}]),
            "delete": _operation("cancel the session", no_content)},
        "/api/v1/sessions/{id}/output": {
            "parameters": [session_id],
            "get": _operation("its output from offsets, then its exit", {"200": stream},
                              parameters=offsets)},
        "/api/v1/sessions/{id}/stdin": {
            "parameters": [session_id],
            "post": _operation("write the body to its stdin", no_content,
                               {"application/octet-stream": {"schema": {
                                   "type": "string", "contentEncoding": "binary"}}})},
        "/api/v1/sessions/{id}/eof": {
            "parameters": [session_id],
            "post": _operation("end its stdin", no_content)},
        "/api/v1/sessions/{id}/signal": {
            "parameters": [session_id],
            "post": _operation("signal its process group", no_content,
                               {"application/json": {"schema": signal}})},
        "/api/v1/sessions/{id}/resize": {
            "parameters": [session_id],
            "post": _operation("resize its terminal", no_content,
                               {"application/json": {"schema": resize}})},
    }
    document = {
        "openapi": "3.1.0",
        "info": {"title": "ttyserve HTTP API", "version": __version__,
                 "description": "Protocol v1, sections 13 and 15."},
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": paths,
    }
    return msgspec.json.encode(document)
