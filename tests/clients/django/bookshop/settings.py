"""Settings of a small Django project that runs its tests on pglease (tests/it/django.rs).

The database comes from DATABASE_URL, parsed here so that the project needs nothing but
Django and psycopg: pglease sets it for the template command (`python manage.py migrate
--noinput`), and a developer points it wherever they like. The tests do not depend on it:
pytest-pglease points `default` at a leased database under pytest-django, and
PgleaseTestRunner does under `manage.py test`.
"""

import os
import urllib.parse


def database_from_url(url: str) -> dict:
    """A DATABASES entry from a `postgresql://user:password@host:port/name?option=…` URL."""
    parts = urllib.parse.urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": urllib.parse.unquote(parts.path.lstrip("/")),
        "USER": urllib.parse.unquote(parts.username or ""),
        "PASSWORD": urllib.parse.unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": dict(urllib.parse.parse_qsl(parts.query)),
    }


SECRET_KEY = "not-a-secret: a test project"
DEBUG = False
ALLOWED_HOSTS: list = []
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# No contrib apps: their post_migrate handlers re-create rows (content types) after every
# flush under new ids, which a serialized_rollback test then cannot load back.
INSTALLED_APPS = ["library"]

DATABASES = {
    "default": database_from_url(
        os.environ.get("DATABASE_URL", "postgresql://test@127.0.0.1:5481/app")
    ),
}

# `manage.py test` leases its databases from pglease (one more per --parallel worker).
TEST_RUNNER = "pytest_pglease.django.PgleaseTestRunner"
