"""RabbitMQ's management HTTP API, read for what AMQP does not tell about a queue.

A passive ``queue.declare`` answers the messages *waiting* in a queue and its consumers, nothing more.
The management plugin's ``GET /api/queues/<vhost>`` also has, per queue, ``messages_unacknowledged``
(delivered to a consumer and not acknowledged yet: in flight) and ``head_message_timestamp`` (the
AMQP ``timestamp`` property of the message at the head of the queue, in whole seconds; absent when
that message was published without one — :class:`broker.rabbitmq.TimestampedRabbitmqBroker` stamps
every message it publishes). RabbitMQ refreshes these numbers every ``collect_statistics_interval``
(5 s by default), so they trail the queue by up to that long; a queue declared since the last
refresh has none yet.

Credentials: the user and password of the API's URL, else the AMQP connection's. They travel as HTTP
basic auth, never in a URL, and no log line or error carries them: the API is named by its scheme,
host and port only (:attr:`ManagementApi.where`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx

logger = logging.getLogger(__name__)

#: How long one request may take, in seconds (a scrape waits for it).
DEFAULT_TIMEOUT_S = 2.0
#: The fields asked for (``columns``): RabbitMQ then leaves out the rest of each queue's statistics.
COLUMNS = "name,messages_unacknowledged,head_message_timestamp"


@dataclass(frozen=True)
class QueueStats:
    """One queue's numbers as the management API last sampled them (``None``: not sampled yet).

    Attributes:
      in_flight: Messages delivered to a consumer and not acknowledged.
      head_timestamp_s: The ``timestamp`` property of the message at the head (Unix seconds), if it has one.
    """

    in_flight: int | None
    head_timestamp_s: int | None


class ManagementApi:
    """A client of one vhost's queues in RabbitMQ's management API.

    Parameters:
      url: The API's base URL (``http(s)://host:15672``, with a path prefix if the plugin has one),
        optionally with ``user:password@``.
      vhost: The virtual host whose queues are read.
      username / password: Used when *url* carries no credentials (the AMQP connection's, usually).
      timeout_s: Per request.
    """

    def __init__(
        self,
        url: str,
        *,
        vhost: str = "/",
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the management API URL must be http(s)://host[:port][/prefix]")
        if parts.username is not None:
            username, password = unquote(parts.username), unquote(parts.password or "")
        address = parts.netloc.rpartition("@")[2]
        self.base = urlunsplit((parts.scheme, address, parts.path.rstrip("/"), "", ""))
        #: Where the API is, without credentials: what log lines and errors may say.
        self.where = f"{parts.scheme}://{address}"
        self.vhost = vhost
        self._auth = None if username is None else (username, password or "")
        self.timeout_s = timeout_s
        self._failing = False

    @classmethod
    def for_connection(cls, url: str, parameters: Any) -> ManagementApi:
        """The API at *url* for the vhost and, unless *url* has its own, the credentials of pika *parameters*
        (one ``ConnectionParameters``, or a list of them: the first one's)."""
        first = parameters[0] if isinstance(parameters, list | tuple) else parameters
        credentials = getattr(first, "credentials", None)
        return cls(
            url,
            vhost=first.virtual_host,
            username=getattr(credentials, "username", None),
            password=getattr(credentials, "password", None),
        )

    def queues(self) -> dict[str, QueueStats] | None:
        """Every queue of the vhost by name, or ``None`` when the API does not answer as expected.

        A failure is logged when it starts (not at every call: scrapes are frequent), and its end too.
        """
        try:
            response = httpx.get(
                f"{self.base}/api/queues/{quote(self.vhost, safe='')}",
                params={"columns": COLUMNS},
                auth=self._auth,
                timeout=self.timeout_s,
            )
            if response.status_code != 200:
                raise _Unexpected(f"HTTP {response.status_code}")
            stats = {str(q["name"]): _stats(q) for q in response.json()}
        except (httpx.HTTPError, ValueError, TypeError, KeyError, _Unexpected) as e:
            if not self._failing:
                # the exception's type and status only: an httpx message may quote the request
                reason = str(e) if isinstance(e, _Unexpected) else type(e).__name__
                logger.warning(
                    "RabbitMQ's management API at %s did not answer (%s): no in-flight counts or lag until it does.",
                    self.where,
                    reason,
                )
            self._failing = True
            return None
        if self._failing:
            logger.info("RabbitMQ's management API at %s answers again.", self.where)
            self._failing = False
        return stats


class _Unexpected(Exception):
    """An answer that is not the queue list."""


def _stats(queue: dict[str, Any]) -> QueueStats:
    return QueueStats(
        in_flight=_count(queue.get("messages_unacknowledged")),
        head_timestamp_s=_count(queue.get("head_message_timestamp")),
    )


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
