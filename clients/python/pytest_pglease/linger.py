"""The watch over a daemon `--pglease-start` started and left running after pytest exited,
because it still serves databases kept of failed tests (`--pglease-keep-failed`).

    python -m pytest_pglease.linger URL PID [PIDFD]     (the API token in PGLEASE_TOKEN)

It stops the daemon (SIGTERM, as pytest would have) once `GET /kept` lists nothing — the
last kept database expired or was dropped — or once the daemon stopped answering, and
exits when the daemon does (`kill PID` stops it earlier). It starts nothing and keeps no
state; the daemon alone decides when a kept database expires.

PIDFD, a pidfd of the daemon opened by pytest while the daemon was still its child, makes
every signal reach that process and no later holder of its pid; without one (Python 3.8,
an old kernel) the pid is used.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Optional

from .client import Client, PgleaseError, PgleaseUnavailable

#: How often /kept is asked.
POLL_SECS = 2.0
#: A daemon that answers no request for this long is stopped: nothing reaches its databases.
SILENT_LIMIT_SECS = 60.0
#: How long a stopping daemon gets before SIGKILL (its own grace period is 30 s).
STOP_GRACE_SECS = 40.0


class Daemon:
    """The daemon's process, through its pidfd when there is one."""

    def __init__(self, pid: int, pidfd: Optional[int]) -> None:
        self.pid = pid
        self.pidfd = pidfd

    def wait(self, timeout: float) -> bool:
        """Whether it exited, waiting up to `timeout` seconds."""
        if self.pidfd is not None:
            readable, _, _ = select.select([self.pidfd], [], [], timeout)
            return bool(readable)
        deadline = time.monotonic() + timeout
        while True:
            if not self._alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.2, timeout))

    def _alive(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                # A zombie waits for init to reap it: it is gone as far as we care.
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    def signal(self, number: int) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, number)
            else:
                os.kill(self.pid, number)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        if not self.wait(STOP_GRACE_SECS):
            self.signal(signal.SIGKILL)
            self.wait(STOP_GRACE_SECS)


def watch(client: Client, daemon: Daemon) -> None:
    silent_since = None
    while True:
        try:
            kept = client.kept()
            silent_since = None
        except (PgleaseError, PgleaseUnavailable):
            kept = None
            silent_since = silent_since or time.monotonic()
        if kept == [] or (
            silent_since is not None and time.monotonic() - silent_since > SILENT_LIMIT_SECS
        ):
            daemon.stop()
            return
        if daemon.wait(POLL_SECS):
            return


def main(argv: list) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 64
    url, pid = argv[0], int(argv[1])
    pidfd = int(argv[2]) if len(argv) == 3 else None
    watch(Client(url, os.environ.get("PGLEASE_TOKEN") or None), Daemon(pid, pidfd))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
