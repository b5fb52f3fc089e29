"""The library app: authors, their books, and loans of them."""

from django.apps import AppConfig


class LibraryConfig(AppConfig):
    name = "library"
