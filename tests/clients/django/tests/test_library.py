"""pytest-django tests on a leased database: no conftest.py, no django_db_setup override;
pytest-pglease's plugin does that (tests/it/django.rs runs them with -n 2)."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from library.models import Author, Book, Loan
from library.testing import record_database


@pytest.mark.django_db
def test_the_template_is_djangos_own_migrate():
    record_database()
    applied = set(MigrationRecorder(connection).applied_migrations())
    assert ("library", "0002_seed_authors") in applied
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []


@pytest.mark.django_db
@pytest.mark.parametrize("n", range(4))
def test_each_test_starts_without_the_others_rows(n):
    record_database()
    assert Book.objects.count() == 0
    Book.objects.create(title=f"Volume {n}", author=Author.objects.create(name=f"Author {n}"))
    assert Book.objects.count() == 1


@pytest.mark.django_db
def test_a_constraint_from_the_migrations_holds():
    record_database()
    book = Book.objects.create(title="Dune", author=Author.objects.create(name="Frank"))
    Loan.objects.create(book=book, borrower="ann")
    with pytest.raises(IntegrityError), transaction.atomic():
        Loan.objects.create(book=book, borrower="bob")


@pytest.mark.django_db
def test_the_database_is_a_lease():
    name = record_database()
    assert not name.startswith("test_"), name
    assert connection.settings_dict["NAME"] == connection.settings_dict["TEST"]["NAME"] == name


@pytest.mark.parametrize("n", range(2))
def test_transactional_tests_commit_and_start_flushed(transactional_db, n):
    record_database()
    assert Book.objects.count() == 0
    committed = []
    with transaction.atomic():
        Book.objects.create(title=f"Emma {n}", author=Author.objects.create(name=f"Jane {n}"))
        transaction.on_commit(lambda: committed.append(True))
    assert committed == [True]
    assert Book.objects.count() == 1


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_serialized_rollback_brings_back_the_seeded_author():
    record_database()
    assert Author.objects.filter(name="Anonymous").exists()


def test_select_for_update_in_a_transactional_test(transactional_db):
    record_database()
    author = Author.objects.create(name="Locked")
    with transaction.atomic():
        assert Author.objects.select_for_update().get(pk=author.pk).name == "Locked"
