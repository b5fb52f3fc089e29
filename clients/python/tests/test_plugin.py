"""The plugin against a real daemon, through suites run the way users run them."""

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from conftest import authorized, daemon_url, get, open_leases

TESTDATA = Path(__file__).resolve().parents[2] / "testdata" / "migrations"


def run(pytester, *args):
    return pytester.runpytest_subprocess(
        f"--pglease-url={daemon_url()}", "--pglease-template=app", "-p", "no:cacheprovider", *args
    )


def test_every_test_gets_a_fresh_migrated_database(pytester):
    pytester.makepyfile(
        test_orders="""
        import psycopg, pytest

        @pytest.mark.parametrize("n", range(3))
        def test_write(pglease_db, n):
            with psycopg.connect(pglease_db.dsn) as conn:
                assert conn.execute("SELECT count(*) FROM customers").fetchone()[0] == 2
                # Another test's committed order would show here if a database came twice.
                assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
                conn.execute("INSERT INTO orders (customer_id, total_cents) VALUES (1, %s)", (n,))

        def test_url_works_too(pglease_db):
            with psycopg.connect(pglease_db.url) as conn:
                assert conn.execute("SELECT current_database()").fetchone()[0] == pglease_db.database
        """
    )
    run(pytester).assert_outcomes(passed=4)
    assert open_leases("test_orders.py") == []


def test_parallel_workers_each_lease_their_own_and_label_them(pytester):
    pytester.makepyfile(
        test_parallel="""
        import json, os, urllib.request
        import psycopg, pytest

        @pytest.mark.parametrize("n", range(12))
        def test_isolated(pglease_db, request, n):
            with psycopg.connect(pglease_db.dsn) as conn:
                conn.execute("INSERT INTO orders (customer_id, total_cents) VALUES (2, %s)", (n,))
                conn.commit()
                rows = conn.execute("SELECT total_cents FROM orders").fetchall()
                assert rows == [(n,)], "another test's order is in this database"
            status = urllib.request.Request(os.environ["PGLEASE_URL"].rstrip("/") + "/status")
            status.add_header("Authorization", "Bearer " + os.environ.get("PGLEASE_TOKEN", ""))
            leases = json.load(urllib.request.urlopen(status))["leases"]
            mine = [l for l in leases if l["id"] == pglease_db.id]
            assert mine and mine[0]["label"] == request.node.nodeid
        """
    )
    result = run(pytester, "-n", "4")
    result.assert_outcomes(passed=12)
    assert open_leases("test_parallel.py") == []


def test_failed_and_erroring_tests_give_their_databases_back(pytester):
    pytester.makepyfile(
        test_broken="""
        import json, os, urllib.request

        seen = []

        def test_fails(pglease_db):
            seen.append(pglease_db.id)
            assert False, "a failing test"

        def test_raises(pglease_db):
            seen.append(pglease_db.id)
            raise RuntimeError("an erroring test")

        def test_after_them():
            # Released in their own teardown, not at the end of the session.
            status = urllib.request.Request(os.environ["PGLEASE_URL"].rstrip("/") + "/status")
            status.add_header("Authorization", "Bearer " + os.environ.get("PGLEASE_TOKEN", ""))
            open_ids = {l["id"] for l in json.load(urllib.request.urlopen(status))["leases"]}
            assert len(seen) == 2 and not open_ids & set(seen)
        """
    )
    run(pytester).assert_outcomes(failed=2, passed=1)
    assert open_leases("test_broken.py") == []


def test_a_failed_tests_database_is_kept_with_its_url(pytester):
    pytester.makepyfile(
        test_keep="""
        import psycopg

        def test_breaks(pglease_db):
            with psycopg.connect(pglease_db.dsn) as conn:
                conn.execute("INSERT INTO orders (customer_id, total_cents) VALUES (1, 4242)")
            assert False, "look at my database"

        def test_passes(pglease_db):
            pass
        """
    )
    result = run(pytester, "--pglease-keep-failed=120")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*kept as the test left it for up to 120 s: postgresql://*"])
    kept = [k for k in get("/kept")["kept"] if k["label"] == "test_keep.py::test_breaks"]
    assert len(kept) == 1, kept
    with psycopg.connect(kept[0]["url"]) as conn:
        assert conn.execute("SELECT total_cents FROM orders").fetchall() == [(4242,)]
    # The passing test's database was not kept; clean up the kept one.
    assert not [k for k in get("/kept")["kept"] if k["label"] == "test_keep.py::test_passes"]
    request = urllib.request.Request(daemon_url() + f"/kept/{kept[0]['id']}", method="DELETE")
    urllib.request.urlopen(authorized(request)).close()


def test_the_session_database_is_shared_by_the_sessions_tests(pytester):
    pytester.makepyfile(
        test_session="""
        import psycopg

        def test_one(pglease_session_db):
            with psycopg.connect(pglease_session_db.dsn) as conn:
                conn.execute("INSERT INTO orders (customer_id, total_cents) VALUES (1, 1)")

        def test_two(pglease_session_db):
            with psycopg.connect(pglease_session_db.dsn) as conn:
                assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
        """
    )
    run(pytester).assert_outcomes(passed=2)
    assert open_leases("pytest session") == []


def test_a_marker_and_the_factory_pick_other_templates(pytester):
    pytester.makepyfile(
        test_templates="""
        import psycopg, pytest

        def tables(db):
            with psycopg.connect(db.dsn) as conn:
                return conn.execute(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                ).fetchone()[0]

        @pytest.mark.pglease(template="default")
        def test_marker(pglease_db):
            assert pglease_db.template == "default" and tables(pglease_db) == 0

        def test_factory(pglease_db, pglease_lease):
            other = pglease_lease("default")
            assert other.database != pglease_db.database
            assert tables(other) == 0 and tables(pglease_db) == 2
        """
    )
    run(pytester).assert_outcomes(passed=2)
    assert open_leases("test_templates.py") == []


def test_an_unknown_template_is_a_clear_error(pytester):
    pytester.makepyfile(test_unknown="def test_it(pglease_db): pass")
    result = pytester.runpytest_subprocess(
        f"--pglease-url={daemon_url()}", "--pglease-template=nope", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*template 'nope'*404 unknown_template*"])


def test_no_daemon_is_a_clear_error(pytester):
    pytester.makepyfile(test_nothing="def test_it(pglease_db): pass")
    result = pytester.runpytest_subprocess(
        "--pglease-url=http://127.0.0.1:9", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no pglease daemon answers at http://127.0.0.1:9*--pglease-start*"])


def test_pglease_start_runs_a_daemon_for_the_session_and_stops_it(pytester):
    binary = os.environ.get("PGLEASE_BIN")
    if not binary:
        pytest.fail("PGLEASE_BIN is not set: the pglease binary to start", pytrace=False)
    url = f"http://127.0.0.1:{free_port()}"
    pytester.makepyfile(
        test_started="""
        import psycopg

        def test_it(pglease_db):
            with psycopg.connect(pglease_db.dsn) as conn:
                assert conn.execute("SELECT count(*) FROM customers").fetchone()[0] == 2
        """
    )
    result = pytester.runpytest_subprocess(
        f"--pglease-url={url}",
        "--pglease-start",
        f"--pglease-bin={binary}",
        f"--pglease-serve-arg=--template=app=migrations:{TESTDATA}",
        "--pglease-template=app",
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=1)
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/healthz", timeout=5)


def test_start_says_at_once_why_a_template_cannot_be_built(pytester):
    binary = os.environ.get("PGLEASE_BIN")
    if not binary:
        pytest.fail("PGLEASE_BIN is not set: the pglease binary to start", pytrace=False)
    pytester.makepyfile(test_never="def test_it(pglease_db): pass")
    started = time.monotonic()
    result = pytester.runpytest_subprocess(
        f"--pglease-url=http://127.0.0.1:{free_port()}",
        "--pglease-start",
        f"--pglease-bin={binary}",
        "--pglease-serve-arg=--template=broken=migrations:/nonexistent/migrations",
        "--pglease-template=broken",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret != 0
    result.stderr.fnmatch_lines(
        ["*--pglease-start: the daemon cannot build a template: broken: *nonexistent*"]
    )
    # Not the 180 s a daemon gets to become ready.
    assert time.monotonic() - started < 90


def test_start_runs_the_pglease_pip_put_into_this_environment(tmp_path, monkeypatch):
    # pglease-bin puts `pglease` into the environment's scripts directory, which is on PATH
    # only while the environment is activated; `venv/bin/pytest --pglease-start` finds it.
    from pytest_pglease import plugin

    scripts = tmp_path / "venv-bin"
    scripts.mkdir()
    monkeypatch.setattr(plugin.sysconfig, "get_path", lambda name: str(scripts))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert plugin.find_binary(None) is None
    installed = scripts / "pglease"
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o755)
    assert plugin.find_binary(None) == str(installed)
    assert plugin.find_binary("/opt/pglease/bin/pglease") == "/opt/pglease/bin/pglease"


KEPT_SUITE = """
import psycopg

def test_breaks(pglease_db):
    with psycopg.connect(pglease_db.dsn) as conn:
        conn.execute("INSERT INTO orders (customer_id, total_cents) VALUES (1, 4242)")
    assert False, "look at my database"
"""


def pglease_binary() -> str:
    binary = os.environ.get("PGLEASE_BIN")
    if not binary:
        pytest.fail("PGLEASE_BIN is not set: the pglease binary to start", pytrace=False)
    return binary


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, waiting for init to reap it, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def watchers_of(pid: int) -> list:
    """The pids of `pytest_pglease.linger` processes watching the daemon `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        if b"pytest_pglease.linger" in argv and str(pid).encode() in argv and alive(int(entry)):
            found.append(int(entry))
    return found


def free_port() -> int:
    """A port nothing listens on now, for a daemon the test starts. A fixed one collided
    with the ports the other tests' servers were given (the kernel hands out the ephemeral
    range to anyone)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(condition, what: str, ceiling: float = 90) -> None:
    deadline = time.monotonic() + ceiling
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {ceiling} s: {what}", pytrace=False)
        time.sleep(0.2)


def run_kept_suite(pytester, url: str, *args):
    pytester.makepyfile(test_kept_after=KEPT_SUITE)
    result = pytester.runpytest_subprocess(
        f"--pglease-url={url}",
        "--pglease-start",
        f"--pglease-bin={pglease_binary()}",
        f"--pglease-serve-arg=--template=app=migrations:{TESTDATA}",
        "--pglease-template=app",
        "--pglease-keep-failed=600",
        "-p",
        "no:cacheprovider",
        *args,
    )
    result.assert_outcomes(failed=1)
    return result.stdout.str()


def daemon_pid(out: str) -> int:
    found = re.search(r"keeps serving them after pytest exits \(pid (\d+), ", out)
    assert found, out
    return int(found.group(1))


def stop_leftover(out: str) -> None:
    """The test's own cleanup, whatever happened: no daemon or watcher outlives it."""
    found = re.search(r"keeps serving them after pytest exits \(pid (\d+), ", out)
    if not found:
        return
    pid = int(found.group(1))
    for process in [pid] + watchers_of(pid):
        if alive(process):
            os.kill(process, signal.SIGTERM)
    wait_until(lambda: not alive(pid) and not watchers_of(pid), "the leftovers stopped")


def test_start_and_keep_failed_leave_the_kept_database_served_until_killed(pytester):
    url = f"http://127.0.0.1:{free_port()}"
    out = run_kept_suite(pytester, url)
    try:
        # pytest has exited; the URL it printed still opens the database as the test left it.
        kept_url = re.search(r"kept as the test left it for up to 600 s: (\S+)", out).group(1)
        with psycopg.connect(kept_url) as conn:
            assert conn.execute("SELECT total_cents FROM orders").fetchall() == [(4242,)]
        pid = daemon_pid(out)
        listing = re.search(r"list them: +(pglease kept --server \S+)", out)
        assert listing, out
        listed = subprocess.run(
            [pglease_binary(), *listing.group(1).split()[1:], "--json"],
            capture_output=True, text=True, check=True,
        ).stdout
        assert "test_kept_after.py::test_breaks" in listed, listed
        stop = re.search(r"stop it now \(drops them\): +(kill \d+)$", out, re.M)
        assert stop and stop.group(1) == f"kill {pid}", out
        subprocess.run(stop.group(1).split(), check=True)
        wait_until(lambda: not alive(pid), "the daemon stopped")
        wait_until(lambda: not watchers_of(pid), "its watcher exited")
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/healthz", timeout=5)
    finally:
        stop_leftover(out)


def test_the_left_daemon_stops_by_itself_once_nothing_is_kept(pytester):
    url = f"http://127.0.0.1:{free_port()}"
    out = run_kept_suite(
        pytester, url, "--pglease-serve-arg=--token=linger-secret", "--pglease-token=linger-secret"
    )
    try:
        pid = daemon_pid(out)
        assert watchers_of(pid), "a watcher runs beside the daemon"
        client = ["--server", url, "--token", "linger-secret"]
        kept = subprocess.run(
            [pglease_binary(), "kept", "--json", *client], capture_output=True, text=True, check=True
        ).stdout
        kept_id = re.search(r'"id": ?"([^"]+)"', kept).group(1)
        # Dropped (or expired: the same empty /kept), the last kept database takes the
        # daemon with it.
        subprocess.run([pglease_binary(), "kept", "--drop", kept_id, *client], check=True)
        wait_until(lambda: not alive(pid), "the daemon stopped by itself")
        wait_until(lambda: not watchers_of(pid), "its watcher exited")
    finally:
        stop_leftover(out)
