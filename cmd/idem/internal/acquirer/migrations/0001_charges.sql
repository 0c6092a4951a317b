-- A charge is money taken from a card (or an account) at the card network.
-- seq orders charges for listing; id is what callers see.
CREATE TABLE acq_charges (
    seq             INTEGER PRIMARY KEY,
    id              TEXT    NOT NULL UNIQUE,
    amount          INTEGER NOT NULL CHECK (amount > 0),
    currency        TEXT    NOT NULL,
    reference       TEXT    NOT NULL,
    description     TEXT    NOT NULL DEFAULT '',
    -- metadata is a JSON object of strings the caller attached (the
    -- caller's own payment key, say), returned as it was given.
    metadata        TEXT    NOT NULL DEFAULT '{}',
    idempotency_key TEXT    NOT NULL,
    amount_refunded INTEGER NOT NULL DEFAULT 0 CHECK (amount_refunded >= 0 AND amount_refunded <= amount),
    created_at      TEXT    NOT NULL
);
CREATE INDEX acq_charges_reference ON acq_charges (reference, seq);

CREATE TABLE acq_refunds (
    seq             INTEGER PRIMARY KEY,
    id              TEXT    NOT NULL UNIQUE,
    charge_id       TEXT    NOT NULL REFERENCES acq_charges (id),
    amount          INTEGER NOT NULL CHECK (amount > 0),
    idempotency_key TEXT    NOT NULL,
    created_at      TEXT    NOT NULL
);
CREATE INDEX acq_refunds_charge ON acq_refunds (charge_id, seq);
