-- idem reconcile reads the payments made at a card network a page at a
-- time, in the order (created_at, id), so that what it holds stays bounded
-- however long the history: each page starts where the last one ended.
--
-- Not CONCURRENTLY: idempg.DB.Migrate runs every migration in a
-- transaction with its record (so that it applies whole or not at all, and
-- replicas migrating at once apply it once), and CREATE INDEX CONCURRENTLY
-- cannot run in one. So, built here, the index holds the payments table's
-- writes (not its reads) while it is built: on a large table, build it
-- first, outside any transaction, while the service runs:
--
--   CREATE INDEX CONCURRENTLY payments_charged_created ON payments (created_at, id) WHERE charge_id IS NOT NULL;
--
-- (should that fail, it leaves an INVALID index: DROP INDEX CONCURRENTLY
-- payments_charged_created, and build it again), then upgrade: this
-- migration finds it and takes no lock. An INVALID one left here (a
-- failed build not dropped) is dropped and built again, with the lock:
-- IF NOT EXISTS would take it for the index, which the planner never uses.
DO $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = current_schema() AND c.relname = 'payments_charged_created' AND NOT i.indisvalid) THEN
		DROP INDEX payments_charged_created;
	END IF;
END
$$;
CREATE INDEX IF NOT EXISTS payments_charged_created ON payments (created_at, id) WHERE charge_id IS NOT NULL;
