"""The PostgreSQL store for team memory (issue 22): many daemons, one database, namespaces
granted per role and enforced by row-level security. ``schema.py`` holds the migrations,
``changes.py`` follows the change log, ``grants.py`` manages who may read or write which
namespace. psycopg is an optional dependency (``pip install 'keymem[team]'``): nothing
outside this package imports it."""
