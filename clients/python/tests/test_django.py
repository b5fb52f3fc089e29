"""The Django hook: the settings a lease gives Django, and pytest-django suites run against
the real daemon's template `app` (customers alice and bob) with no conftest.py.

The full Django project (`manage.py migrate` as the template, -n 2, `manage.py test
--parallel 2`) is tests/clients/django, run by tests/it/django.rs.
"""

import os

import pytest

if os.environ.get("PGLEASE_REQUIRE_TOOLS"):
    # CI installs them (.ci/run): there a missing Django fails, it does not skip.
    import django  # noqa: F401
    import pytest_django  # noqa: F401
else:
    pytest.importorskip("django")
    pytest.importorskip("pytest_django")

from pytest_pglease.client import Database  # noqa: E402
from pytest_pglease.django import (  # noqa: E402
    UnsupportedDatabases,
    leased_settings,
    unsupported_aliases,
)

from conftest import daemon_url, get, open_leases  # noqa: E402

LEASE = Database(
    id="00ab",
    template="app",
    host="127.0.0.1",
    port=5433,
    user="pglease_u1",
    password="secret",
    database="pglease_3f_7",
    url="postgresql://pglease_u1:secret@127.0.0.1:5433/pglease_3f_7?sslmode=disable",
    expires_at="",
)


def test_a_lease_fills_every_connection_field_and_the_test_name():
    current = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "app",
        "HOST": "db.example",
        "OPTIONS": {"sslmode": "prefer"},
        "TEST": {"CHARSET": "UTF8", "NAME": "test_app"},
    }
    assert leased_settings(current, LEASE) == {
        "NAME": "pglease_3f_7",
        "USER": "pglease_u1",
        "PASSWORD": "secret",
        "HOST": "127.0.0.1",
        "PORT": "5433",
        # The other TEST keys stay; the name is the leased database's, never test_….
        "TEST": {"CHARSET": "UTF8", "NAME": "pglease_3f_7"},
    }
    # The caller's dict is left alone (it is restored from at the end).
    assert current["TEST"] == {"CHARSET": "UTF8", "NAME": "test_app"}


def test_only_default_and_its_mirrors_are_leased():
    databases = {
        "default": {},
        "replica": {"TEST": {"MIRROR": "default"}},
        "legacy": {"TEST": {"NAME": "legacy"}},
    }
    assert unsupported_aliases(["default", "replica"], databases) == set()
    assert unsupported_aliases(["default", "replica", "legacy"], databases) == {"legacy"}
    message = str(UnsupportedDatabases({"legacy"}))
    assert "'legacy'" in message and "-p no:pglease_django" in message


SETTINGS = """
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        # Nothing listens here: every test must be on the lease.
        "NAME": "app", "HOST": "127.0.0.1", "PORT": "1", "USER": "nobody",
    },
    %s
}
USE_TZ = True
"""


def django_suite(pytester, extra_database="", **files):
    pytester.makefile(".py", settings=SETTINGS % extra_database)
    pytester.makeini("[pytest]\nDJANGO_SETTINGS_MODULE = settings\npythonpath = .\n")
    pytester.makepyfile(**files)


def run(pytester, *args):
    return pytester.runpytest_subprocess(
        f"--pglease-url={daemon_url()}", "--pglease-template=app", "-p", "no:cacheprovider", *args
    )


def test_pytest_django_tests_run_on_a_leased_database_without_a_conftest(pytester):
    django_suite(
        pytester,
        test_customers="""
        import pytest
        from django.db import connection, transaction

        def count(table):
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {table}")
                return cursor.fetchone()[0]

        @pytest.mark.django_db
        @pytest.mark.parametrize("n", range(3))
        def test_rolled_back(n):
            assert count("customers") == 2 and count("orders") == 0
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO orders (customer_id, total_cents) VALUES (1, %s)", [n])

        def test_transactional(transactional_db):
            # Django flushes only its models' tables: the template's are untouched.
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT current_database()")
                name = cursor.fetchone()[0]
            assert connection.settings_dict["TEST"]["NAME"] == name
            assert not name.startswith("test_")
        """,
    )
    run(pytester, "-n", "2").assert_outcomes(passed=4)
    assert open_leases("django (") == []


def test_another_database_alias_is_refused_by_name(pytester):
    django_suite(
        pytester,
        extra_database='"legacy": {"ENGINE": "django.db.backends.postgresql", "NAME": "legacy"},',
        test_legacy="""
        import pytest

        @pytest.mark.django_db(databases=["default", "legacy"])
        def test_both():
            pass
        """,
    )
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*pglease leases only Django's 'default' database*'legacy'*"])
    assert open_leases("django (") == []


def test_a_conftest_django_db_setup_still_wins(pytester):
    django_suite(
        pytester,
        conftest="""
        import pytest

        @pytest.fixture(scope="session")
        def django_db_setup():
            pass
        """,
        test_own="""
        from django.db import connection

        def test_own_setup(django_db_setup):
            assert connection.settings_dict["PORT"] == "1"
        """,
    )
    run(pytester).assert_outcomes(passed=1)
    assert not [l for l in get("/status")["leases"] if l.get("label", "").startswith("django (")]
