"""The pytest plugin: options, the daemon it may start, and the fixtures.

- `pglease_db`: a fresh database for each test, released in its teardown (kept as the test
  left it when the test failed and --pglease-keep-failed is given);
- `pglease_session_db`: one database for the session (one per xdist worker);
- `pglease_lease`: a factory, for several databases or other templates in one test;
- `pglease_client`: the HTTP client itself;
- with pytest-django active, `django_db_setup`: Django's `default` database is a lease of
  the template (`pytest_pglease.django_plugin`).

Each lease is labelled with the test's node id, so `pglease status` shows who holds what.

A daemon --pglease-start started stops at the end, unless databases of failed tests were
kept (--pglease-keep-failed): it then keeps serving them after pytest exits, watched by
`pytest_pglease.linger`, which stops it once none is kept any more.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
from typing import Callable, Iterator, Optional

import pytest

from .client import Client, Database, PgleaseError, PgleaseUnavailable
from .leasing import SETTINGS, Settings, lease as _lease, release as _release

#: --pglease-keep-failed without a value: an hour to look at a failed test's database.
DEFAULT_KEEP_SECS = 3600


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pglease", "pglease: a fresh PostgreSQL database per test")
    group.addoption(
        "--pglease-url",
        help="the daemon's URL [env PGLEASE_URL, ini pglease_url; default http://127.0.0.1:5480]",
    )
    group.addoption("--pglease-token", help="the daemon's API token [env PGLEASE_TOKEN]")
    group.addoption(
        "--pglease-template",
        help="template of pglease_db and pglease_session_db [env PGLEASE_TEMPLATE, ini "
        "pglease_template; default: default]; @pytest.mark.pglease(template=...) per test",
    )
    group.addoption("--pglease-ttl", type=int, help="a lease's time to live, seconds")
    group.addoption(
        "--pglease-wait-ms", type=int, help="how long a lease may wait for a database"
    )
    group.addoption(
        "--pglease-keep-failed",
        nargs="?",
        type=int,
        const=DEFAULT_KEEP_SECS,
        help=f"keep a failed test's database for SECS [default {DEFAULT_KEEP_SECS}] and show "
        "its URL in the test's report [env PGLEASE_KEEP_FAILED]",
    )
    group.addoption(
        "--pglease-start",
        action="store_true",
        help="start `pglease serve` on the URL's port when no daemon answers there, and "
        "stop it at the end (once, also under pytest-xdist); with --pglease-keep-failed, "
        "when databases were kept, it serves them after pytest exits and stops once the "
        "last expired or was dropped",
    )
    group.addoption(
        "--pglease-bin",
        help="the pglease binary for --pglease-start [env PGLEASE_BIN; default: the one "
        "pip installed into this environment (pglease-bin), else PATH]",
    )
    group.addoption(
        "--pglease-serve-arg",
        action="append",
        default=[],
        help="an argument for the started daemon, repeatable, e.g. "
        "--pglease-serve-arg=--template=app=migrations:db/migrations",
    )
    parser.addini("pglease_url", "the daemon's URL")
    parser.addini("pglease_template", "the template of pglease_db")
    parser.addini("pglease_serve_args", "arguments for a daemon --pglease-start starts", "args")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pglease(template): the template this test's pglease_db comes from"
    )
    settings = Settings.from_config(config)
    config.stash[SETTINGS] = settings
    # With pytest-django active, Django's test database is a lease too (django_plugin.py).
    from . import django_plugin

    django_plugin.register(config)
    # Under pytest-xdist only the controller starts the daemon, before it starts workers.
    if settings.start and not hasattr(config, "workerinput"):
        start_daemon(settings)


def pytest_unconfigure(config: pytest.Config) -> None:
    settings = config.stash.get(SETTINGS, None)
    if settings is None:
        return
    client = settings.client()
    for lease_id in list(settings.open_leases):
        try:
            client.release(lease_id)
        except (PgleaseError, PgleaseUnavailable):
            pass
    if settings.daemon is not None:
        if settings.lingering is None:
            settings.lingering = kept_by_started_daemon(settings)
            if settings.lingering:
                sys.stderr.write("\n".join(lingering_lines(settings)) + "\n")
        if settings.lingering:
            leave_daemon_running(settings)
        else:
            stop_daemon(settings)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Says so when the daemon this run started keeps serving databases of failed tests."""
    settings = config.stash.get(SETTINGS, None)
    if settings is None or settings.daemon is None:
        return
    settings.lingering = kept_by_started_daemon(settings)
    if settings.lingering:
        terminalreporter.write_sep("-", "pglease")
        for line in lingering_lines(settings):
            terminalreporter.write_line(line)




@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Keeps each phase's report on the item: the teardown asks whether the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"_pglease_rep_{report.when}", report)


def start_daemon(settings: Settings) -> None:
    client = settings.client()
    if client.healthy():
        return
    binary = find_binary(settings.binary)
    if not binary:
        raise pytest.UsageError(
            "--pglease-start: no pglease binary in this environment nor on PATH "
            "(`pip install pglease-bin` puts one here; or give --pglease-bin or PGLEASE_BIN)"
        )
    address = urllib.parse.urlsplit(settings.url)
    listen = f"{address.hostname or '127.0.0.1'}:{address.port or 5480}"
    log = tempfile.NamedTemporaryFile(prefix="pglease-", suffix=".log", delete=False)
    settings.daemon_log = log.name
    settings.daemon = subprocess.Popen(
        [binary, "serve", "--listen", listen, *settings.serve_args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        # A session of its own: a terminal's Ctrl-C or hang-up reaches pytest only, and
        # pytest decides whether the daemon stops (pytest_unconfigure). It may outlive
        # pytest, serving kept databases.
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if settings.daemon.poll() is not None:
            raise pytest.UsageError(
                f"--pglease-start: `pglease serve` exited ({settings.daemon.returncode}); "
                f"its log: {log.name}\n{tail(log.name)}"
            )
        try:
            readiness = client.readiness()
        except (PgleaseError, PgleaseUnavailable):
            time.sleep(0.2)
            continue
        if readiness.get("ready"):
            return
        # A template that failed stays failed until its sources change: say why now
        # rather than wait out the deadline.
        failed = readiness.get("failed_templates") or []
        if failed:
            stop_daemon(settings)
            why = "; ".join(f"{t.get('name')}: {t.get('error')}" for t in failed)
            raise pytest.UsageError(
                f"--pglease-start: the daemon cannot build a template: {why}\n"
                f"its log: {log.name}"
            )
        time.sleep(0.2)
    stop_daemon(settings)
    raise pytest.UsageError(f"--pglease-start: the daemon was not ready in 180 s; log {log.name}")


def find_binary(given: Optional[str]) -> Optional[str]:
    """The pglease that --pglease-start runs: the one given, else the one in pytest's own
    environment (the pglease-bin wheel this plugin depends on puts it into the environment's
    scripts directory, which is on PATH only while the environment is activated), else the
    first on PATH."""
    if given:
        return given
    name = "pglease.exe" if os.name == "nt" else "pglease"
    installed = os.path.join(sysconfig.get_path("scripts"), name)
    if os.path.isfile(installed) and os.access(installed, os.X_OK):
        return installed
    return shutil.which("pglease")


def stop_daemon(settings: Settings) -> None:
    daemon = settings.daemon
    settings.daemon = None
    if daemon is None or daemon.poll() is not None:
        return
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=40)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def kept_by_started_daemon(settings: Settings) -> list:
    """The databases the daemon this run started keeps (only this run used it)."""
    if settings.daemon is None or settings.daemon.poll() is not None:
        return []
    try:
        return settings.client().kept()
    except (PgleaseError, PgleaseUnavailable):
        return []


def lingering_lines(settings: Settings) -> list:
    daemon = settings.daemon
    kept = settings.lingering or []
    pid = daemon.pid if daemon is not None else "?"
    last = max(k.get("expires_at", "") for k in kept)
    # The token itself stays out of the output; `pglease kept` reads PGLEASE_TOKEN.
    token = "   (its token in PGLEASE_TOKEN)" if settings.token else ""
    return [
        f"pglease: {len(kept)} database(s) of failed tests kept: the daemon this run started "
        f"keeps serving them after pytest exits (pid {pid}, {settings.url}, log "
        f"{settings.daemon_log}); it stops by itself once none is kept, at the latest when "
        f"the last expires ({last})",
        f"  list them:                  pglease kept --server {settings.url}{token}",
        f"  stop it now (drops them):   kill {pid}",
    ]


def leave_daemon_running(settings: Settings) -> None:
    """Leaves the started daemon running after pytest, with a watcher that stops it once it
    keeps nothing (`pytest_pglease.linger`)."""
    daemon = settings.daemon
    settings.daemon = None
    if daemon is None:
        return
    args = [sys.executable, "-m", "pytest_pglease.linger", settings.url, str(daemon.pid)]
    pass_fds: tuple = ()
    # Opened while the daemon is still our child (its pid cannot be reused yet), the pidfd
    # lets the watcher signal that process and no other.
    pidfd_open = getattr(os, "pidfd_open", None)
    pidfd = None
    if pidfd_open is not None:
        try:
            pidfd = pidfd_open(daemon.pid)
            args.append(str(pidfd))
            pass_fds = (pidfd,)
        except OSError:
            pidfd = None
    env = dict(os.environ)
    if settings.token:
        env["PGLEASE_TOKEN"] = settings.token
    # The package's directory first, so that the watcher runs this very plugin's code.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    with open(settings.daemon_log or os.devnull, "ab") as log:
        subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
            env=env,
            start_new_session=True,
        )
    if pidfd is not None:
        os.close(pidfd)
    # pytest exits without waiting for the daemon: once it is gone, init reaps it. Marking
    # it waited-for keeps Popen's finalizer from warning that it still runs.
    daemon.returncode = 0


def tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as log:
            return "".join(log.readlines()[-lines:])
    except OSError:
        return ""


def _template_of(request: pytest.FixtureRequest, settings: Settings) -> str:
    marker = request.node.get_closest_marker("pglease")
    if marker is not None:
        return marker.kwargs.get("template") or (marker.args[0] if marker.args else settings.template)
    return settings.template


@pytest.fixture(scope="session")
def pglease_client(pytestconfig: pytest.Config) -> Client:
    """The HTTP client of the daemon the fixtures lease from."""
    return pytestconfig.stash[SETTINGS].client()


@pytest.fixture
def pglease_db(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[Database]:
    """A fresh database for this test, released in its teardown (also when it failed)."""
    settings = pytestconfig.stash[SETTINGS]
    database = _lease(settings, _template_of(request, settings), request.node.nodeid)
    yield database
    call = getattr(request.node, "_pglease_rep_call", None)
    failed = call is not None and call.failed
    note = _release(settings, database, settings.keep_failed if failed else None)
    if note:
        request.node.add_report_section("teardown", "pglease", note)


@pytest.fixture(scope="session")
def pglease_session_db(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[Database]:
    """One database for the whole session (under pytest-xdist, one per worker)."""
    settings = pytestconfig.stash[SETTINGS]
    worker = getattr(pytestconfig, "workerinput", {}).get("workerid", "main")
    database = _lease(settings, settings.template, f"pytest session ({worker})")
    yield database
    _release(settings, database)


@pytest.fixture
def pglease_lease(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Iterator[Callable[..., Database]]:
    """A factory: `pglease_lease("reports")` leases another database for this test."""
    settings = pytestconfig.stash[SETTINGS]
    leased = []

    def lease(template: Optional[str] = None) -> Database:
        database = _lease(settings, template or settings.template, request.node.nodeid)
        leased.append(database)
        return database

    yield lease
    for database in leased:
        _release(settings, database)
