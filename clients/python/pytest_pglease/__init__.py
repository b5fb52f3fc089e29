"""pytest fixtures for pglease: a fresh, migrated PostgreSQL database for every test.

Installing the package enables the plugin (`pytest_pglease.plugin`); see README.md.
"""

from .client import Client, Database, PgleaseError, PgleaseUnavailable

__all__ = ["Client", "Database", "PgleaseError", "PgleaseUnavailable"]
