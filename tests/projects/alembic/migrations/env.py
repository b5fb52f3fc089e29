"""Alembic's environment: online migrations against DATABASE_URL (pglease sets it to the
template being built, a postgresql:// URL SQLAlchemy accepts)."""

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name)

engine = create_engine(os.environ["DATABASE_URL"], poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
