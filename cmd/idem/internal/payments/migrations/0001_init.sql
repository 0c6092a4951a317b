-- Accounts hold a balance in minor units; the CHECK is the last line of
-- defence behind the conditional debit in the code.
CREATE TABLE accounts (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    balance    INTEGER NOT NULL CHECK (balance >= 0),
    currency   TEXT NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE payments (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    amount      INTEGER NOT NULL CHECK (amount > 0),
    currency    TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL
);

CREATE INDEX payments_account_created ON payments (account_id, created_at);

CREATE TABLE deposits (
    id            TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    account_id    TEXT NOT NULL REFERENCES accounts (id),
    amount        INTEGER NOT NULL CHECK (amount > 0),
    balance_after INTEGER NOT NULL,
    created_at    TEXT NOT NULL
);

CREATE INDEX deposits_account_created ON deposits (account_id, created_at);
