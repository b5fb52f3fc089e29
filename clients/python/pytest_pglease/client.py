"""A small client of pglease's HTTP API (standard library only): lease, release, keep."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

#: How long one HTTP call may take beyond the lease's own wait.
HTTP_MARGIN_SECS = 30


class PgleaseError(Exception):
    """The daemon answered with an error: its HTTP status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"pglease answered {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class PgleaseUnavailable(Exception):
    """No daemon answers at the URL."""


@dataclass(frozen=True)
class Database:
    """A leased database and what opens it."""

    id: str
    template: str
    host: str
    port: int
    user: str
    password: str
    database: str
    url: str
    expires_at: str

    @property
    def dsn(self) -> str:
        """A libpq conninfo string (psycopg, asyncpg and psql take it)."""
        quote = lambda v: "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"
        parts = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": self.database,
        }
        return " ".join(f"{key}={quote(value)}" for key, value in parts.items())

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> "Database":
        return cls(
            id=answer["id"],
            template=answer["template"],
            host=answer["host"],
            port=int(answer["port"]),
            user=answer["user"],
            password=answer["password"],
            database=answer["database"],
            url=answer["url"],
            expires_at=answer.get("expires_at", ""),
        )


class Client:
    """Talks to one pglease daemon."""

    def __init__(self, url: str = "http://127.0.0.1:5480", token: Optional[str] = None):
        self.url = url.rstrip("/")
        self.token = token

    def lease(
        self,
        template: str = "default",
        *,
        label: Optional[str] = None,
        ttl_secs: Optional[int] = None,
        wait_ms: Optional[int] = None,
    ) -> Database:
        body: dict[str, Any] = {"template": template}
        if label:
            body["label"] = clean_label(label)
        if ttl_secs is not None:
            body["ttl_secs"] = ttl_secs
        if wait_ms is not None:
            body["wait_ms"] = wait_ms
        timeout = (wait_ms or 60_000) / 1000 + HTTP_MARGIN_SECS
        return Database.from_answer(self._call("POST", "/lease", body, timeout))

    def release(self, lease_id: str, *, keep_secs: Optional[int] = None) -> None:
        """Drops the lease's database, or with `keep_secs` keeps it as it is for a look."""
        query = f"keep={keep_secs}" if keep_secs else "reuse=false"
        self._call("DELETE", f"/leases/{lease_id}?{query}")

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/status")

    def kept(self) -> list[dict[str, Any]]:
        return self._call("GET", "/kept")["kept"]

    def healthy(self) -> bool:
        try:
            self._call("GET", "/healthz", timeout=2)
            return True
        except (PgleaseUnavailable, PgleaseError):
            return False

    def readiness(self) -> dict:
        """GET /readyz: its answer, ready (200) or not (503): `ready`, `reason`,
        `failed_templates` ([{name, error}]), `building_templates`."""
        try:
            return self._call("GET", "/readyz", timeout=2)
        except PgleaseError as error:
            if error.status == 503 and error.code == "http_error":
                try:
                    return json.loads(error.message)
                except ValueError:
                    pass
            raise

    def _call(self, method: str, path: str, body: Any = None, timeout: float = HTTP_MARGIN_SECS):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode()
                return json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                detail = json.loads(text)["error"]
                raise PgleaseError(error.code, detail["code"], detail["message"]) from None
            except (ValueError, KeyError, TypeError):
                raise PgleaseError(error.code, "http_error", text or error.reason) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            raise PgleaseUnavailable(
                f"no pglease daemon answers at {self.url} ({getattr(error, 'reason', error)}): "
                "start one with `pglease serve`, point --pglease-url / PGLEASE_URL at it, "
                "or pass --pglease-start"
            ) from None


def clean_label(label: str) -> str:
    """At most 256 characters, the end kept (a test id's end names the test), no control
    characters (the daemon refuses them)."""
    label = "".join(ch for ch in label if ch.isprintable())
    return label[-256:]
