-- Payments and deposits record the execution of the idempotency key that
-- made them: the key and when it was claimed. The unique index lets a
-- re-run of the same execution (after a crash, with the key in another
-- store) find the row instead of charging again. Rows without a key (unsafe
-- mode, no key) have NULLs, which never conflict.
ALTER TABLE payments ADD COLUMN idempotency_key TEXT;
ALTER TABLE payments ADD COLUMN key_claimed_at TEXT;
CREATE UNIQUE INDEX payments_idempotency ON payments (tenant, idempotency_key, key_claimed_at);

ALTER TABLE deposits ADD COLUMN idempotency_key TEXT;
ALTER TABLE deposits ADD COLUMN key_claimed_at TEXT;
CREATE UNIQUE INDEX deposits_idempotency ON deposits (tenant, idempotency_key, key_claimed_at);
