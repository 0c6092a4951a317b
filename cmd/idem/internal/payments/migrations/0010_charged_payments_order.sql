-- idem reconcile reads the payments made at a card network a page at a
-- time, in the order (created_at, id), so that what it holds stays bounded
-- however long the history: each page starts where the last one ended.
CREATE INDEX payments_charged_created ON payments (created_at, id) WHERE charge_id IS NOT NULL;
