"""Typed errors, every one the platform raises. Each carries its HTTP status (and the
gRPC status of the same failure, ``grpc_code``); one handler
(``infergate.http``) turns any of them into ``{"error": message, "type": kind}``, and
``exit_code`` into one line on the command line."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable


class InfergateError(Exception):
    """Base class. ``status`` is the HTTP status a request failing with it gets."""

    status: int = 500
    kind: str = "internal_error"
    # The gRPC status of the same failure (a grpc.StatusCode's name), for the Open
    # Inference Protocol over gRPC: https://grpc.github.io/grpc/core/md_doc_statuscodes.html
    grpc_code: str = "INTERNAL"
    param: str | None = None  # the request field at fault, where there is one

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict[str, str]:
        return {"error": self.message, "type": self.kind}

    def headers(self) -> dict[str, str]:
        """Response headers the status asks for (``Retry-After`` on a 429)."""
        return {}


def exit_code(command: Callable[[], int]) -> int:
    """Run a command-line command: its exit code, or 1 after printing the message of an
    ``InfergateError`` (no traceback: the message says what to do)."""
    try:
        return int(command())
    except InfergateError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1


class InvalidInput(InfergateError):
    status = 422
    kind = "invalid_input"
    grpc_code = "INVALID_ARGUMENT"


class WrongTask(InfergateError):
    """A route of Text Embeddings Inference's API asked of a model of a task it does not
    serve (``/embed`` of a classifier): TEI answers 424, which its clients expect."""

    status = 424
    kind = "wrong_task"
    grpc_code = "FAILED_PRECONDITION"


class MalformedBody(InfergateError):
    status = 400
    kind = "malformed_body"
    grpc_code = "INVALID_ARGUMENT"


class PayloadTooLarge(InfergateError):
    status = 413
    kind = "payload_too_large"
    grpc_code = "RESOURCE_EXHAUSTED"


class UnsupportedMediaType(InfergateError):
    status = 415
    kind = "unsupported_media_type"
    grpc_code = "INVALID_ARGUMENT"


class Unauthorized(InfergateError):
    """No valid credentials: an API key, an admin token, or a webhook's signature."""

    status = 401
    kind = "unauthorized"
    grpc_code = "UNAUTHENTICATED"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}  # RFC 9110, 15.5.2: say how to authenticate


class Forbidden(InfergateError):
    """Valid credentials that do not cover what was asked (a model outside a key's scope)."""

    status = 403
    kind = "forbidden"
    grpc_code = "PERMISSION_DENIED"


class RequestTimeout(InfergateError):
    """The client did not send its whole request in time (a slow or stalled upload)."""

    status = 408
    kind = "request_timeout"
    grpc_code = "DEADLINE_EXCEEDED"

    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}


class ModelNotFound(InfergateError):
    status = 404
    kind = "model_not_found"
    grpc_code = "NOT_FOUND"


class RouteNotFound(InfergateError):
    status = 404
    kind = "not_found"
    grpc_code = "NOT_FOUND"


class MethodNotAllowed(InfergateError):
    status = 405
    kind = "method_not_allowed"
    grpc_code = "UNIMPLEMENTED"

    def __init__(self, message: str, allow: str = "") -> None:
        super().__init__(message)
        self.allow = allow  # "GET, HEAD": the methods the route takes (RFC 9110, 15.5.6)

    def headers(self) -> dict[str, str]:
        return {"Allow": self.allow} if self.allow else {}


class RolloutConflict(InfergateError):
    """A rollout command that the model's rollout state does not allow."""

    status = 409
    kind = "rollout_conflict"
    grpc_code = "FAILED_PRECONDITION"


class Overloaded(InfergateError):
    """More work than the server takes now; the client should come back after
    ``retry_after_s``."""

    status = 429
    kind = "overloaded"
    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        # Retry-After takes whole seconds (RFC 9110, section 10.2.3).
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class RateLimited(Overloaded):
    """An API key over its requests or texts per second."""

    kind = "rate_limited"


class ClientClosedRequest(InfergateError):
    """The client went away before its request was read (nginx's 499: nobody gets it)."""

    status = 499
    kind = "client_closed_request"
    grpc_code = "CANCELLED"


class BackendUnavailable(InfergateError):
    """Triton is down or not ready. The body never carries internals."""

    status = 503
    kind = "backend_unavailable"
    grpc_code = "UNAVAILABLE"


class ColdStartTimeout(BackendUnavailable):
    """A served version that was not loaded did not load within the cold-start deadline
    (or could not be loaded now); it is likely ready a moment later."""

    kind = "cold_start"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class BackendTimeout(BackendUnavailable):
    """Triton did not answer in time: a retry of the same request will not help."""

    status = 504
    kind = "backend_timeout"
    grpc_code = "DEADLINE_EXCEEDED"


class DeliveryUnderWay(InfergateError):
    """A webhook delivery whose first attempt is still being handled."""

    status = 503  # MLflow retries a 503, backing off
    kind = "delivery_under_way"
    grpc_code = "UNAVAILABLE"


class RegistrationError(InfergateError):
    """Registering a model failed: a broken folder, a wrong task, a parity failure."""

    kind = "registration_failed"


class StackError(InfergateError):
    """The local stack could not start: a port in use, a missing binary, a dead process."""

    kind = "stack_error"


class InvalidConfig(InfergateError):
    """Configuration the platform cannot use: a wrong setting in the config file or an
    ``INFERGATE_*`` variable, or a broken API key file. Its message names what is wrong
    and where, in one line."""

    kind = "invalid_config"


class CommandFailed(InfergateError):
    """The control plane refused a command (``infergate canary ...``); its message says why."""

    kind = "command_failed"


class DashboardError(InfergateError):
    """Generating, pushing or rendering dashboards failed for a reason the user can fix."""

    kind = "dashboard_error"


class BatchError(InfergateError):
    """An ``infergate batch`` job that cannot start (a bad file, column or option) or
    did not finish every part."""

    status = 400
    kind = "batch_error"
    grpc_code = "INVALID_ARGUMENT"
