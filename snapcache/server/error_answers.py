"""The server's error answers: OpenAI's error format, and the request problem that becomes a 4xx."""

from __future__ import annotations

from typing import Any

__all__ = ["BadRequest", "client_error", "error_document"]


def error_document(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An error in the OpenAI API's format, as clients parse it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class BadRequest(Exception):
    """A request the server will not run, with the status and what was wrong with it."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def document(self) -> dict[str, Any]:
        """The error in the OpenAI API's shape (a status of 500 or more is a server error)."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return error_document(str(self), kind=kind, param=self.param, code=self.code)


def client_error(error: BaseException) -> dict[str, Any] | None:
    """The 400 body for a completion that failed because of what it asked for; None for others.

    llama-cpp-python says so only in its exceptions' text and type: a prompt longer than the
    context; a chat template's refusal (roles that do not alternate, a role it does not know); and
    an answer that reached the end of the context inside a character, where its generation loop
    goes on past the last free cell (`llama_decode returned 1`) instead of stopping.
    """
    from jinja2 import TemplateError

    text = str(error)
    if isinstance(error, ValueError) and "exceed context window" in text:
        return error_document(text, param="messages", code="context_length_exceeded")
    if isinstance(error, TemplateError):
        message = f"the model's chat template refused the messages: {text}"
        return error_document(message, param="messages")
    if isinstance(error, RuntimeError) and text == "llama_decode returned 1":
        message = (
            "the prompt and the answer filled the model's context before the answer ended; ask for "
            "fewer tokens (max_tokens) so that both fit"
        )
        return error_document(message, param="max_tokens", code="context_length_exceeded")
    return None
