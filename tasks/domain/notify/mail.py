"""Send one email over SMTP (STARTTLS by default) and classify the outcome.

Outcomes: ``delivered`` (the server accepted the DATA); ``retry`` (a 4xx reply, or a connection,
TLS or timeout failure *before* the message was handed over); ``dead`` (a 5xx reply, bad
credentials, a server without STARTTLS — the password is never sent in clear); ``unknown`` (the
connection failed *while* the message was being handed over: it may have been delivered, so the job
layer parks it as ``interrupted`` instead of re-sending a duplicate).

The password is only passed to ``SMTP.login``; outcomes, logs and exception texts never carry it.
"""

from __future__ import annotations

import logging
import smtplib
import ssl
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Literal

from .secret import Secret, redact

logger = logging.getLogger(__name__)

#: SMTP connect/read timeout.
DEFAULT_SMTP_TIMEOUT_S = 30.0

EmailStatus = Literal["delivered", "retry", "dead", "unknown"]


@dataclass(frozen=True)
class SmtpConfig:
    """How to reach the mail server."""

    host: str
    port: int = 587
    username: str | None = None
    password: Secret | None = field(default=None, repr=False)
    security: Literal["starttls", "tls", "none"] = "starttls"
    timeout_s: float = DEFAULT_SMTP_TIMEOUT_S
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)  # None: system CAs, hostname checked


@dataclass(frozen=True)
class Email:
    """One message. ``message_id`` should be stable per notification (derive it from the job)."""

    sender: str
    to: tuple[str, ...]
    subject: str
    text: str
    html: str | None = None
    message_id: str | None = None


@dataclass(frozen=True)
class EmailOutcome:
    """The result of one send."""

    status: EmailStatus
    message_id: str
    code: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0


def build_message(email: Email) -> EmailMessage:
    """The MIME message (UTF-8 headers are RFC 2047-encoded by the stdlib).

    Parameters
    ----------
    email:
        What to send.

    Returns
    -------
    email.message.EmailMessage
    """
    msg = EmailMessage()
    msg["From"] = email.sender
    msg["To"] = ", ".join(email.to)
    msg["Subject"] = email.subject
    msg["Message-ID"] = email.message_id or make_msgid(domain="tenure.local")
    msg.set_content(email.text)
    if email.html:
        msg.add_alternative(email.html, subtype="html")
    return msg


def send_email(config: SmtpConfig, email: Email) -> EmailOutcome:
    """Send ``email`` through ``config``'s server.

    Parameters
    ----------
    config:
        Server, credentials, security.
    email:
        The message.

    Returns
    -------
    EmailOutcome
        Never raises for SMTP or network failures; they are outcomes.
    """
    msg = build_message(email)
    message_id = str(msg["Message-ID"])
    started = time.monotonic()
    secrets = [config.password.reveal() if config.password else None]
    in_data = False  # True once the message may have reached the server

    def outcome(status: EmailStatus, code: int | None = None, error: str | None = None) -> EmailOutcome:
        safe = redact(error, secrets)[:300] if error else None
        result = EmailOutcome(status, message_id, code, safe, time.monotonic() - started)
        logger.info("email %s to %d recipient(s): %s %s", message_id, len(email.to), status, safe or "")
        return result

    try:
        context = config.ssl_context or ssl.create_default_context()
        if config.security == "tls":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(config.host, config.port, timeout=config.timeout_s, context=context)
        else:
            smtp = smtplib.SMTP(config.host, config.port, timeout=config.timeout_s)
        with smtp:
            smtp.ehlo()
            if config.security == "starttls":
                if not smtp.has_extn("starttls"):
                    return outcome(
                        "dead", error="server does not offer STARTTLS; refusing to send credentials in clear"
                    )
                smtp.starttls(context=context)
                smtp.ehlo()
            if config.username:
                smtp.login(config.username, config.password.reveal() if config.password else "")
            code, reply = smtp.mail(email.sender)
            if code != 250:
                return outcome(_by_code(code), code, f"MAIL FROM refused: {code} {_text(reply)}")
            for rcpt in email.to:
                code, reply = smtp.rcpt(rcpt)
                if code not in (250, 251):
                    smtp.rset()
                    return outcome(_by_code(code), code, f"RCPT TO refused: {code} {_text(reply)}")
            in_data = True
            code, reply = smtp.data(msg.as_bytes())
            in_data = False
            if code != 250:
                return outcome(_by_code(code), code, f"DATA refused: {code} {_text(reply)}")
            return outcome("delivered", code)
    except smtplib.SMTPAuthenticationError as exc:
        return outcome("dead", exc.smtp_code, f"authentication failed: {exc.smtp_code}")
    except smtplib.SMTPNotSupportedError as exc:
        return outcome("dead", None, f"server does not support a required extension: {exc}")
    except smtplib.SMTPResponseException as exc:
        # A definite reply from the server, even during DATA: 4xx retry, 5xx dead.
        return outcome(_by_code(exc.smtp_code), exc.smtp_code, f"{exc.smtp_code} {_text(exc.smtp_error)}")
    except (smtplib.SMTPException, OSError) as exc:
        if in_data:
            return outcome("unknown", None, f"connection lost while sending the message: {type(exc).__name__}")
        return outcome("retry", None, f"{type(exc).__name__}: {exc}")


def _by_code(code: int) -> EmailStatus:
    return "retry" if 400 <= code < 500 else "dead"


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
