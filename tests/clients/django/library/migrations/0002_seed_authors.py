"""A data migration: every database built from the template starts with this author, which
a serialized_rollback test finds again after other tests flushed the tables."""

from django.db import migrations


def seed(apps, schema_editor):
    apps.get_model("library", "Author").objects.create(name="Anonymous")


def unseed(apps, schema_editor):
    apps.get_model("library", "Author").objects.filter(name="Anonymous").delete()


class Migration(migrations.Migration):
    dependencies = [("library", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
