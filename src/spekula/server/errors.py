"""Errors a client can cause, as OpenAI-style error objects: {"error": {message, type, param, code}}.

Every message says what to change. The status says whose move it is:
400 the request is malformed or a value is wrong, whatever the model (including bodies that are not
    strict JSON: NaN, Infinity, numbers that overflow a float, nesting deeper than the parser goes);
    every such refusal comes before a stream's 200, never as an error event after it;
401 the API key is missing or wrong;
404 no such model (or path);
413 the body is larger than --max-body-bytes;
422 the request is well-formed but this model cannot serve it (prompt longer than its context,
    chat messages for a model without a chat template);
429 the queue is full: retry after the Retry-After header;
503 the server is shutting down;
504 the request ran past --request-timeout.
"""

from __future__ import annotations

from typing import Any

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param, "code": code}
    }
