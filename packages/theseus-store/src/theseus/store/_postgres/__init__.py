"""The PostgreSQL backend: a store's rows in a database, its files in a folder every host sees.

A store on PostgreSQL keeps its rows in one database and its files (blobs larger than
``INLINE_MAX``, checkpoints, everything a run writes) in a folder every host sees, named
by the URL's ``files`` parameter::

    postgresql://USER@HOST:PORT/DB?files=/shared/folder

The store's folder is ``/shared/folder/store``: its marker records the store's id and a
URL that reaches the database, and the database holds the same id, so the folder and
the database are bound to each other (``_binding``) and ``Store("/shared/folder/store")``
(or the root ``/shared/folder`` wherever a root is taken) opens the same store. A
password comes from ``PGPASSWORD`` or ``~/.pgpass`` (libpq reads both); one written in
the URL is used to connect and never written or printed.

The backend's modules: ``_url`` (the URL), ``_dialect`` (PostgreSQL's side of the SQL the
backends cannot share), ``_connection`` (psycopg's connection taking the shared
statements; the schema in PostgreSQL's types), ``_database`` (:class:`PostgresDatabase`:
connecting, transactions, retries, errors) and ``_binding`` (folder and database bound by
the store's id).
"""

from theseus.store._postgres._binding import bound_url, refuse_sqlite_store
from theseus.store._postgres._database import PostgresDatabase
from theseus.store._postgres._url import SCHEMES, DatabaseURL, is_database_url

__all__ = [
    "SCHEMES",
    "DatabaseURL",
    "PostgresDatabase",
    "bound_url",
    "is_database_url",
    "refuse_sqlite_store",
]
