"""Three models with a foreign key chain and a partial unique constraint, enough for the
tests to write, roll back and flush real rows."""

from django.db import models


class Author(models.Model):
    name = models.CharField(max_length=200, unique=True)


class Book(models.Model):
    title = models.CharField(max_length=200)
    author = models.ForeignKey(Author, on_delete=models.CASCADE, related_name="books")
    published = models.DateField(null=True)


class Loan(models.Model):
    book = models.ForeignKey(Book, on_delete=models.CASCADE, related_name="loans")
    borrower = models.CharField(max_length=200)
    returned = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # A book is lent to one borrower at a time.
            models.UniqueConstraint(
                fields=["book"],
                condition=models.Q(returned=False),
                name="one_open_loan_per_book",
            )
        ]
