"""Django's own test classes: `manage.py test --parallel 2` runs them with
PgleaseTestRunner, and pytest-django runs them too (pytest.ini collects tests.py)."""

from django.db import IntegrityError, connection, transaction
from django.test import TestCase, TransactionTestCase

from .models import Author, Book, Loan
from .testing import record_database


class AuthorTests(TestCase):
    def test_writes_are_rolled_back_after_each_test(self):
        record_database()
        self.assertFalse(Author.objects.filter(name="Ursula").exists())
        Author.objects.create(name="Ursula")
        self.assertEqual(Author.objects.filter(name="Ursula").count(), 1)

    def test_the_database_is_a_lease_not_a_test_database(self):
        name = record_database()
        self.assertFalse(name.startswith("test_"), name)
        self.assertEqual(connection.settings_dict["TEST"]["NAME"], name)


class LoanTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.book = Book.objects.create(title="Dune", author=Author.objects.create(name="Frank"))

    def test_a_book_is_lent_once_at_a_time(self):
        record_database()
        Loan.objects.create(book=self.book, borrower="ann")
        with self.assertRaises(IntegrityError), transaction.atomic():
            Loan.objects.create(book=self.book, borrower="bob")

    def test_a_returned_book_is_lent_again(self):
        record_database()
        Loan.objects.create(book=self.book, borrower="ann", returned=True)
        Loan.objects.create(book=self.book, borrower="bob")
        self.assertEqual(self.book.loans.count(), 2)


class CommitTests(TransactionTestCase):
    def test_committed_rows_are_flushed_afterwards(self):
        record_database()
        self.assertEqual(Book.objects.count(), 0)
        with transaction.atomic():
            Book.objects.create(title="Emma", author=Author.objects.create(name="Jane"))
        self.assertEqual(Book.objects.count(), 1)


class SeedTests(TransactionTestCase):
    serialized_rollback = True

    def test_the_templates_data_migration_is_there(self):
        record_database()
        self.assertTrue(Author.objects.filter(name="Anonymous").exists())
