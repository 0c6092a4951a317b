-- The key's lock (idem_key_lock) is the schema's: a hash of the schema as
-- well as of scope and key. Advisory locks belong to the database, not to
-- a schema, so the lock of scope and key alone (0003) was shared by every
-- schema of the database: a ClaimTx holding a key in one schema made the
-- claims of the same scope and key in every other schema wait for it, or
-- answer InFlight for a key they had never seen. And a claim that must not
-- wait for other schemas' transactions (idempgsql's, in an application's
-- transaction) took a lock of its own instead, which ClaimTx does not take,
-- so that the two could both acquire one key at once.
--
-- The schema enters as a number fixed here, as the function is made, so
-- that the function stays an immutable SQL expression, which the planner
-- inlines into the claims' statements.
--
-- Every claimant calls the function by name, so replacing it changes the
-- lock of every process at once, whatever its version; only a transaction
-- that took the old lock and is still running when this migration commits
-- goes unseen by the claims that take the new one.
DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION idem_key_lock(p_scope text, p_key text) RETURNS bigint
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        RETURN hashtextextended(p_key, hashtextextended(p_scope, %s))
    $f$, hashtextextended(current_schema(), 0));
END
$migration$;
