-- The payment service's tables in PostgreSQL, in the schema idempg puts on
-- every connection's search_path. Amounts are bigint minor units; the CHECK
-- on the balance is the last line of defence behind the conditional debit.
CREATE TABLE accounts (
    id         text PRIMARY KEY,
    tenant     text NOT NULL,
    balance    bigint NOT NULL CHECK (balance >= 0),
    currency   text NOT NULL,
    created_at timestamptz NOT NULL
);

-- Payments and deposits record the execution of the idempotency key that
-- made them (the key and when it was claimed). The unique constraint lets a
-- re-run of that execution, after a crash with the key in another store,
-- find the row instead of charging again. Rows without a key (unsafe mode,
-- no key) hold NULLs, which never conflict. seq orders rows created in the
-- same microsecond.
CREATE TABLE payments (
    id              text PRIMARY KEY,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    tenant          text NOT NULL,
    account_id      text NOT NULL REFERENCES accounts (id),
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL,
    description     text NOT NULL DEFAULT '',
    status          text NOT NULL,
    created_at      timestamptz NOT NULL,
    idempotency_key text,
    key_claimed_at  timestamptz,
    CONSTRAINT payments_idempotency UNIQUE (tenant, idempotency_key, key_claimed_at)
);

CREATE INDEX payments_account_created ON payments (account_id, created_at DESC, seq DESC);

CREATE TABLE deposits (
    id              text PRIMARY KEY,
    tenant          text NOT NULL,
    account_id      text NOT NULL REFERENCES accounts (id),
    amount          bigint NOT NULL CHECK (amount > 0),
    balance_after   bigint NOT NULL,
    created_at      timestamptz NOT NULL,
    idempotency_key text,
    key_claimed_at  timestamptz,
    CONSTRAINT deposits_idempotency UNIQUE (tenant, idempotency_key, key_claimed_at)
);

CREATE INDEX deposits_account_created ON deposits (account_id, created_at);
