-- Refunds give part or all of a payment back to its account. Each payment
-- carries the total refunded so far; the refund's transaction raises it
-- with a conditional UPDATE (refunded + amount <= amount), and the CHECK is
-- the last line of defence behind it: the refunds of a payment can never
-- sum past the payment.
ALTER TABLE payments ADD COLUMN refunded INTEGER NOT NULL DEFAULT 0 CHECK (refunded >= 0 AND refunded <= amount);

-- A refund records the execution of the idempotency key that made it, like
-- payments and deposits; settled is the settlement consumer's mark, as on
-- payments.
CREATE TABLE refunds (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    payment_id      TEXT NOT NULL REFERENCES payments (id),
    account_id      TEXT NOT NULL REFERENCES accounts (id),
    amount          INTEGER NOT NULL CHECK (amount > 0),
    currency        TEXT NOT NULL,
    reason          TEXT NOT NULL DEFAULT '',
    status          TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    idempotency_key TEXT,
    key_claimed_at  TEXT,
    settled         INTEGER NOT NULL DEFAULT 0 CHECK (settled IN (0, 1)),
    UNIQUE (tenant, idempotency_key, key_claimed_at)
);

CREATE INDEX refunds_payment ON refunds (payment_id);

-- Lists are walked newest first by (created_at, id), from a cursor.
CREATE INDEX payments_account_created_id ON payments (account_id, created_at, id);
CREATE INDEX deposits_account_created_id ON deposits (account_id, created_at, id);

-- How many refunds the settlement subtracted from its total.
ALTER TABLE settlements ADD COLUMN refunds INTEGER NOT NULL DEFAULT 0;
