"""Request bodies of unknown length (``Transfer-Encoding: chunked``) held to the same limits as declared ones.

gunicorn decodes a chunked body and marks the stream as terminated (``wsgi.input_terminated``); Werkzeug
then reads such a stream up to ``max_content_length`` and stops there without a word, so a body over the
limit arrived cut (a 2 MiB JSON body parsed as 1 MiB of "unterminated string", a 422). A declared
``Content-Length`` over the limit is refused by Werkzeug before a byte is read; a chunked body cannot be
judged before it is read. :func:`read_chunked_body` (a ``before_request`` of the app, after the upload
limit is chosen and before anything reads the body) reads it up to its limit plus one byte: one byte
more is a 413 with the reason, anything else is handed on whole (in memory up to
:data:`SPOOL_MAX_BYTES`, on disk beyond: an upload may be 512 MiB).
"""

from __future__ import annotations

import tempfile

from flask import request

from .errors import PayloadTooLarge

#: A buffered chunked body stays in memory up to this size, then moves to a temporary file.
SPOOL_MAX_BYTES = 1024 * 1024
#: Bytes read from the client at a time.
READ_BYTES = 64 * 1024


def read_chunked_body() -> None:
    """``before_request``: refuse a chunked body over ``request.max_content_length`` (413); else buffer it."""
    environ = request.environ
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    limit = request.max_content_length
    if not chunked or not environ.get("wsgi.input_terminated") or limit is None:
        return  # a declared length (Werkzeug enforces it), no body, or no limit
    source = environ["wsgi.input"]
    buffer = tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES)
    total = 0
    while chunk := source.read(min(READ_BYTES, limit + 1 - total)):
        total += len(chunk)
        if total > limit:
            buffer.close()
            raise PayloadTooLarge(f"The request body exceeds {limit} bytes.")
        buffer.write(chunk)
    buffer.seek(0)
    # Werkzeug wraps this stream in its own limit again; it ends within it, so it is read whole.
    environ["wsgi.input"] = buffer
