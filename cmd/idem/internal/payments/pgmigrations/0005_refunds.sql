-- Refunds give part or all of a payment back to its account. Each payment
-- carries the total refunded so far; the refund's transaction raises it
-- with a conditional UPDATE (refunded + amount <= amount) under the
-- payment's row lock, and the CHECK is the last line of defence behind it:
-- the refunds of a payment can never sum past the payment.
ALTER TABLE payments ADD COLUMN refunded bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT payments_refunded_within CHECK (refunded >= 0 AND refunded <= amount);

-- A refund records the execution of the idempotency key that made it, like
-- payments and deposits; settled is the settlement consumer's mark, as on
-- payments.
CREATE TABLE refunds (
    id              text PRIMARY KEY,
    tenant          text NOT NULL,
    payment_id      text NOT NULL REFERENCES payments (id),
    account_id      text NOT NULL REFERENCES accounts (id),
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL,
    reason          text NOT NULL DEFAULT '',
    status          text NOT NULL,
    created_at      timestamptz NOT NULL,
    idempotency_key text,
    key_claimed_at  timestamptz,
    settled         boolean NOT NULL DEFAULT false,
    CONSTRAINT refunds_idempotency UNIQUE (tenant, idempotency_key, key_claimed_at)
);

CREATE INDEX refunds_payment ON refunds (payment_id);

-- Lists are walked newest first by (created_at, id), from a cursor.
CREATE INDEX payments_account_created_id ON payments (account_id, created_at, id);
CREATE INDEX deposits_account_created_id ON deposits (account_id, created_at, id);

-- How many refunds the settlement subtracted from its total.
ALTER TABLE settlements ADD COLUMN refunds bigint NOT NULL DEFAULT 0;
