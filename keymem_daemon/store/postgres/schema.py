"""The PostgreSQL store's schema, as versioned migrations with the SQLite store's versions.

``MIGRATIONS[i]`` takes a database from schema version ``i`` to ``i + 1``, exactly as
``store.sqlite.database.MIGRATIONS`` does (same tables, same columns, same meaning), so an
export from either backend imports losslessly into the other. The applied version is the one
row of ``keymem_schema`` (SQLite keeps it in ``PRAGMA user_version``). ``migrate(conn)``
applies what is pending, each step in one transaction together with its version bump, under
an advisory lock so two daemons starting at once do not both migrate; it refuses a database
from a newer keymem and one that holds tables but is not a keymem store.

What PostgreSQL adds to the SQLite schema (all in step 1):

- **Lexical index.** ``memory_fts`` holds, per indexed memory, the same space-separated
  Kiwi/stemmed ``content_tokens`` and ``key_tokens`` the SQLite FTS5 table stores, and a
  generated ``lexemes`` tsvector built from those tokens as they are (``keymem_tsvector``:
  no second tokenizer, positions kept so term frequencies count; content weighted A, keys B),
  under a GIN index.
- **Change log.** ``changes`` gets one row per changed memory, key, alias, link, relation or
  meta entry, written by triggers in the transaction of the write itself (no code path can
  forget it), and every statement that adds rows sends ``NOTIFY keymem_changes`` (delivered
  at COMMIT, payload empty: a listener learns nothing but "look"). ``seq`` orders the rows;
  ``tx`` (the writing transaction's id) lets a follower read without skipping a row whose
  transaction commits late: see ``changes.py``.
- **Access control.** ``grants(namespace, role, mode)`` says which role may read or write
  which namespace (write implies read; a grant to a group role covers its members). Row-level
  security on every table enforces it for any connection that is not the owner -- keymem or
  ``psql`` alike: memories (and their index rows, links, relations, change rows) by the
  memory's namespace; idempotency records and the activity log per role as well. The
  vocabulary (keys, aliases, learned-alias candidates, meta) is shared by everyone holding a
  grant in the database (read) or a write grant (change): keys are shared across namespaces
  in keymem's model, so a key's text is visible to every member, the memories behind it only
  to those granted their namespace. Table privileges go to PUBLIC and the database's CONNECT
  privilege is what admits a role at all: the policies, not GRANT, decide what it sees.
  The owner (and its members) bypass the policies and alone change ``grants``.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import psycopg

from keymem_daemon.errors import StoreError

logger = logging.getLogger(__name__)

VERSION_TABLE: Final = "keymem_schema"
NOTIFY_CHANNEL: Final = "keymem_changes"
# pg_advisory_xact_lock key for migrations: any fixed bigint, the same for every keymem.
_MIGRATION_LOCK: Final = 0x6B65796D656D  # "keymem"

_SCHEMA_V1: Final = """
CREATE TABLE keymem_schema (version integer NOT NULL);
INSERT INTO keymem_schema VALUES (0);

CREATE TABLE grants (
    namespace text NOT NULL,
    role text NOT NULL,
    mode text NOT NULL CHECK (mode IN ('read', 'write')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, role)
);

-- The namespaces the current role (or a role it is a member of) may read or write.
CREATE FUNCTION keymem_namespaces(need text) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT g.namespace), '{}')
    FROM grants g JOIN pg_roles r ON r.rolname = g.role
    WHERE (need = 'read' OR g.mode = 'write') AND pg_has_role(r.oid, 'USAGE')
$$;

-- A tsvector of already tokenized text: each space-separated token is one lexeme, as it is
-- (no parser, no dictionary), with its positions so that term frequency counts.
CREATE FUNCTION keymem_tsvector(tokens text, weight "char") RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT setweight(coalesce(string_agg(lexeme || ':' || positions, ' '), '')::tsvector, weight)
    FROM (
        SELECT '''' || replace(replace(left(t, 500), '\\', '\\\\'), '''', '''''') || '''' AS lexeme,
               string_agg(least(n, 16383)::text, ',' ORDER BY n) AS positions
        FROM unnest(string_to_array(coalesce(tokens, ''), ' ')) WITH ORDINALITY AS u(t, n)
        WHERE t <> ''
        GROUP BY t
    ) s
$$;

CREATE TABLE meta (
    name text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE keys (
    id text PRIMARY KEY,
    concept text NOT NULL,
    norm text NOT NULL,
    compact text NOT NULL,
    key_type text NOT NULL DEFAULT 'concept' CHECK (key_type IN ('concept', 'name', 'proper_noun')),
    vector bytea NOT NULL,
    created_at double precision NOT NULL
);
CREATE INDEX keys_by_norm ON keys(norm);

CREATE TABLE aliases (
    key_id text NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
    alias text NOT NULL,
    norm text NOT NULL,
    compact text NOT NULL,
    learned integer NOT NULL DEFAULT 0,
    added_at double precision NOT NULL,
    hits integer NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, norm)
);
CREATE INDEX aliases_by_norm ON aliases(norm);

CREATE TABLE memories (
    rowid bigint GENERATED BY DEFAULT AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    content text NOT NULL,
    dedup_hash text NOT NULL,
    namespace text NOT NULL,
    depth double precision NOT NULL DEFAULT 0,
    access_count integer NOT NULL DEFAULT 0,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    last_accessed double precision,
    observed_at double precision,
    last_confirmed_at double precision NOT NULL,
    confirmation_count integer NOT NULL DEFAULT 1,
    decay_profile text NOT NULL DEFAULT 'standard'
        CHECK (decay_profile IN ('transient', 'standard', 'stable', 'permanent')),
    last_confirmation_evidence text,
    last_confirmation_source text,
    last_confirmation_id text,
    expires_at double precision,
    supersedes text,
    superseded_by text,
    source text,
    vector bytea
);
CREATE INDEX memories_by_dedup ON memories(namespace, dedup_hash);
CREATE INDEX memories_by_expiry ON memories(expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memories_by_supersedes ON memories(supersedes) WHERE supersedes IS NOT NULL;
CREATE INDEX memories_by_when ON memories(namespace, (COALESCE(observed_at, created_at)));

CREATE TABLE links (
    key_id text NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
    memory_id text NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
    weight double precision NOT NULL DEFAULT 1.0,
    auto integer NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, memory_id)
);
CREATE INDEX links_by_memory ON links(memory_id, key_id, weight, auto);

CREATE TABLE relations (
    from_id text NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
    to_id text NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
    PRIMARY KEY (from_id, to_id)
);
CREATE INDEX relations_by_target ON relations(to_id);

CREATE TABLE alias_candidates (
    key_id text NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
    norm text NOT NULL,
    query_text text NOT NULL,
    count integer NOT NULL DEFAULT 0,
    last_seen double precision NOT NULL,
    PRIMARY KEY (key_id, norm)
);

-- Idempotency keys are per role: one person's key never replays another's answer.
CREATE TABLE idempotency (
    actor text NOT NULL DEFAULT current_user,
    key text NOT NULL,
    result text NOT NULL,
    created_at double precision NOT NULL,
    PRIMARY KEY (actor, key)
);

CREATE TABLE memory_fts (
    memory_id text PRIMARY KEY REFERENCES memories(id) ON DELETE CASCADE,
    content_tokens text NOT NULL,
    key_tokens text NOT NULL,
    lexemes tsvector GENERATED ALWAYS AS
        (keymem_tsvector(content_tokens, 'A') || keymem_tsvector(key_tokens, 'B')) STORED
);
CREATE INDEX memory_fts_lexemes ON memory_fts USING gin (lexemes);

CREATE TABLE changes (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tx xid8 NOT NULL DEFAULT pg_current_xact_id(),
    namespace text,
    kind text NOT NULL CHECK (kind IN ('memory', 'key', 'alias', 'link', 'relation', 'meta')),
    id text NOT NULL,
    op text NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX changes_by_tx ON changes(tx, seq);

CREATE FUNCTION keymem_log_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_kind text := TG_ARGV[0];
    v_op text := lower(TG_OP);
    v_rec record;
    v_ns text;
    v_id text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        v_rec := OLD;
    ELSE
        v_rec := NEW;
    END IF;
    IF v_kind = 'memory' THEN
        v_id := v_rec.id;
        v_ns := v_rec.namespace;
        IF TG_OP = 'UPDATE' AND OLD.namespace IS DISTINCT FROM NEW.namespace THEN
            INSERT INTO changes(namespace, kind, id, op) VALUES (OLD.namespace, v_kind, v_id, 'delete');
            v_op := 'insert';
        END IF;
    ELSIF v_kind IN ('link', 'relation') THEN
        IF v_kind = 'link' THEN
            v_id := v_rec.memory_id;
        ELSE
            v_id := v_rec.from_id;
        END IF;
        SELECT m.namespace INTO v_ns FROM memories m WHERE m.id = v_id;
        IF v_ns IS NULL THEN
            RETURN NULL;  -- the memory itself was deleted: its own change row says so
        END IF;
    ELSIF v_kind = 'alias' THEN
        v_id := v_rec.key_id;
    ELSIF v_kind = 'meta' THEN
        v_id := v_rec.name;
    ELSE
        v_id := v_rec.id;
    END IF;
    INSERT INTO changes(namespace, kind, id, op) VALUES (v_ns, v_kind, v_id, v_op);
    RETURN NULL;
END
$$;

CREATE TRIGGER memories_changed AFTER INSERT OR UPDATE OR DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION keymem_log_change('memory');
CREATE TRIGGER keys_changed AFTER INSERT OR UPDATE OR DELETE ON keys
    FOR EACH ROW EXECUTE FUNCTION keymem_log_change('key');
CREATE TRIGGER aliases_changed AFTER INSERT OR UPDATE OR DELETE ON aliases
    FOR EACH ROW EXECUTE FUNCTION keymem_log_change('alias');
CREATE TRIGGER links_changed AFTER INSERT OR UPDATE OR DELETE ON links
    FOR EACH ROW EXECUTE FUNCTION keymem_log_change('link');
CREATE TRIGGER relations_changed AFTER INSERT OR UPDATE OR DELETE ON relations
    FOR EACH ROW EXECUTE FUNCTION keymem_log_change('relation');
CREATE TRIGGER meta_changed AFTER INSERT OR UPDATE OR DELETE ON meta
    FOR EACH ROW EXECUTE FUNCTION keymem_log_change('meta');

CREATE FUNCTION keymem_notify_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('keymem_changes', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER changes_notify AFTER INSERT ON changes
    FOR EACH STATEMENT EXECUTE FUNCTION keymem_notify_changes();

GRANT SELECT ON keymem_schema, grants TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE
    ON meta, keys, aliases, memories, links, relations, alias_candidates, idempotency, memory_fts TO PUBLIC;
GRANT SELECT, INSERT ON changes TO PUBLIC;

ALTER TABLE grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_grants ON grants FOR SELECT
    USING (EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role AND pg_has_role(r.oid, 'USAGE')));

ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
CREATE POLICY read ON memories FOR SELECT USING (namespace = ANY ((SELECT keymem_namespaces('read'))::text[]));
CREATE POLICY add ON memories FOR INSERT WITH CHECK (namespace = ANY ((SELECT keymem_namespaces('write'))::text[]));
CREATE POLICY change ON memories FOR UPDATE USING (namespace = ANY ((SELECT keymem_namespaces('write'))::text[]))
    WITH CHECK (namespace = ANY ((SELECT keymem_namespaces('write'))::text[]));
CREATE POLICY remove ON memories FOR DELETE USING (namespace = ANY ((SELECT keymem_namespaces('write'))::text[]));

ALTER TABLE memory_fts ENABLE ROW LEVEL SECURITY;
CREATE POLICY read ON memory_fts FOR SELECT USING (EXISTS (SELECT 1 FROM memories m WHERE m.id = memory_id));
CREATE POLICY write ON memory_fts FOR ALL
    USING (EXISTS (SELECT 1 FROM memories m WHERE m.id = memory_id
                   AND m.namespace = ANY ((SELECT keymem_namespaces('write'))::text[])))
    WITH CHECK (EXISTS (SELECT 1 FROM memories m WHERE m.id = memory_id
                        AND m.namespace = ANY ((SELECT keymem_namespaces('write'))::text[])));

ALTER TABLE links ENABLE ROW LEVEL SECURITY;
CREATE POLICY read ON links FOR SELECT USING (EXISTS (SELECT 1 FROM memories m WHERE m.id = memory_id));
CREATE POLICY write ON links FOR ALL
    USING (EXISTS (SELECT 1 FROM memories m WHERE m.id = memory_id
                   AND m.namespace = ANY ((SELECT keymem_namespaces('write'))::text[])))
    WITH CHECK (EXISTS (SELECT 1 FROM memories m WHERE m.id = memory_id
                        AND m.namespace = ANY ((SELECT keymem_namespaces('write'))::text[])));

ALTER TABLE relations ENABLE ROW LEVEL SECURITY;
CREATE POLICY read ON relations FOR SELECT
    USING (EXISTS (SELECT 1 FROM memories m WHERE m.id = from_id)
           AND EXISTS (SELECT 1 FROM memories m WHERE m.id = to_id));
CREATE POLICY write ON relations FOR ALL
    USING (EXISTS (SELECT 1 FROM memories m WHERE m.id = from_id
                   AND m.namespace = ANY ((SELECT keymem_namespaces('write'))::text[])))
    WITH CHECK (EXISTS (SELECT 1 FROM memories m WHERE m.id = from_id
                        AND m.namespace = ANY ((SELECT keymem_namespaces('write'))::text[]))
                AND EXISTS (SELECT 1 FROM memories m WHERE m.id = to_id));

ALTER TABLE keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE aliases ENABLE ROW LEVEL SECURITY;
ALTER TABLE alias_candidates ENABLE ROW LEVEL SECURITY;
ALTER TABLE meta ENABLE ROW LEVEL SECURITY;
CREATE POLICY read ON keys FOR SELECT USING (cardinality((SELECT keymem_namespaces('read'))) > 0);
CREATE POLICY write ON keys FOR ALL USING (cardinality((SELECT keymem_namespaces('write'))) > 0);
CREATE POLICY read ON aliases FOR SELECT USING (cardinality((SELECT keymem_namespaces('read'))) > 0);
CREATE POLICY write ON aliases FOR ALL USING (cardinality((SELECT keymem_namespaces('write'))) > 0);
CREATE POLICY read ON alias_candidates FOR SELECT USING (cardinality((SELECT keymem_namespaces('read'))) > 0);
CREATE POLICY write ON alias_candidates FOR ALL USING (cardinality((SELECT keymem_namespaces('write'))) > 0);
CREATE POLICY read ON meta FOR SELECT USING (cardinality((SELECT keymem_namespaces('read'))) > 0);
CREATE POLICY write ON meta FOR ALL USING (cardinality((SELECT keymem_namespaces('write'))) > 0);

ALTER TABLE idempotency ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON idempotency FOR ALL
    USING (actor = current_user AND cardinality((SELECT keymem_namespaces('write'))) > 0)
    WITH CHECK (actor = current_user AND cardinality((SELECT keymem_namespaces('write'))) > 0);

ALTER TABLE changes ENABLE ROW LEVEL SECURITY;
CREATE POLICY read ON changes FOR SELECT
    USING (CASE WHEN namespace IS NULL THEN cardinality((SELECT keymem_namespaces('read'))) > 0
                ELSE namespace = ANY ((SELECT keymem_namespaces('read'))::text[]) END);
CREATE POLICY add ON changes FOR INSERT
    WITH CHECK (CASE WHEN namespace IS NULL THEN cardinality((SELECT keymem_namespaces('write'))) > 0
                     ELSE namespace = ANY ((SELECT keymem_namespaces('write'))::text[]) END)
"""

_IDEMPOTENCY_FINGERPRINT: Final = "ALTER TABLE idempotency ADD COLUMN fingerprint text"

# As SQLite's activity log, plus who wrote each entry and (when it is about one) the namespace:
# an entry is visible to its writer, and to whoever may read its namespace.
_SCHEMA_ACTIVITY: Final = """
CREATE TABLE activity (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    at double precision NOT NULL,
    kind text NOT NULL,
    memory_id text,
    summary text NOT NULL,
    detail text NOT NULL,
    actor text NOT NULL DEFAULT current_user,
    namespace text
);
CREATE INDEX activity_by_at ON activity(at);
CREATE INDEX activity_by_memory ON activity(memory_id) WHERE memory_id IS NOT NULL;
GRANT SELECT, INSERT, DELETE ON activity TO PUBLIC;
ALTER TABLE activity ENABLE ROW LEVEL SECURITY;
CREATE POLICY read ON activity FOR SELECT
    USING (actor = current_user OR namespace = ANY ((SELECT keymem_namespaces('read'))::text[]));
CREATE POLICY add ON activity FOR INSERT
    WITH CHECK (actor = current_user
                AND (namespace IS NULL OR namespace = ANY ((SELECT keymem_namespaces('write'))::text[])));
CREATE POLICY remove ON activity FOR DELETE USING (actor = current_user)
"""

# Ordered: MIGRATIONS[i] takes a database from schema version i to i + 1, as SQLite's.
MIGRATIONS: Final[tuple[str, ...]] = (_SCHEMA_V1, _IDEMPOTENCY_FINGERPRINT, _SCHEMA_ACTIVITY)
SCHEMA_VERSION: Final = len(MIGRATIONS)


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The applied schema version: 0 for a database keymem has not set up yet."""
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()
    if not (found and found[0]):
        return 0
    row = conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchone()
    return int(row[0]) if row else 0


def _foreign_tables(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1").fetchall()
    return [str(r[0]) for r in rows]


def migrate(conn: psycopg.Connection[Any], *, where: str) -> int:
    """Apply every pending migration on ``conn``, each step in its own transaction with its
    version bump; return the version reached. ``where`` names the server in errors."""
    while True:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            current = schema_version(conn)
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{where} was written by a newer keymem (schema {current}, this version knows "
                    f"{SCHEMA_VERSION}); upgrade keymem instead of downgrading the store")
            if current == SCHEMA_VERSION:
                return current
            if current == 0 and (tables := _foreign_tables(conn)):
                raise StoreError(f"{where} holds tables but is not a keymem store ({', '.join(tables[:5])}); it "
                                 "was left unchanged -- point KEYMEM_STORE_URL at an empty database")
            conn.execute(MIGRATIONS[current].encode())
            conn.execute(f"UPDATE {VERSION_TABLE} SET version = %s", (current + 1,))
        logger.info("store at %s migrated to schema %d", where, current + 1)
