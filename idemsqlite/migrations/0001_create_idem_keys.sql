-- One row per idempotency key. Times are unix nanoseconds; completed_at is
-- NULL while the key is in flight, and so are the response columns.
CREATE TABLE idem_keys (
    scope            TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    fingerprint      TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token            INTEGER NOT NULL,
    status           INTEGER,
    header           TEXT,
    body             BLOB,
    body_omitted     INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    PRIMARY KEY (scope, key)
);

-- Purge finds expired records through it.
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);
