-- The message tables: inbox, outbox, dead letters, the consumer's ledger and
-- the embedded transport. Times are unix nanoseconds (0 for a zero time);
-- headers are JSON objects, NULL when there are none.

-- One row per message a consumer has processed. Kept at least as long as
-- the transport can redeliver the message; PurgeInbox deletes older ones.
CREATE TABLE idem_inbox (
    consumer     TEXT    NOT NULL,
    dedup_key    TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, dedup_key)
);
CREATE INDEX idem_inbox_processed_at ON idem_inbox (processed_at);

-- Messages written with the effect they announce, until a relay has
-- published them. lease_until is 0 while no relay holds the entry.
CREATE TABLE idem_outbox (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    headers     TEXT,
    payload     BLOB,
    msg_time    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    relay       TEXT,
    lease_until INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE idem_dead_letters (
    id              TEXT    PRIMARY KEY,
    consumer        TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    topic           TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    headers         TEXT,
    payload         BLOB,
    msg_time        INTEGER NOT NULL,
    class           TEXT    NOT NULL CHECK (class IN ('permanent', 'exhausted')),
    state           TEXT    NOT NULL CHECK (state IN ('dead', 'redriven', 'discarded')),
    first_failed_at INTEGER NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    -- added orders letters that failed last at the same time.
    added           INTEGER NOT NULL
);
CREATE INDEX idem_dead_letters_last ON idem_dead_letters (last_failed_at, added);
CREATE INDEX idem_dead_letters_state ON idem_dead_letters (state, consumer);

CREATE TABLE idem_dead_letter_attempts (
    letter_id TEXT    NOT NULL REFERENCES idem_dead_letters (id),
    ord       INTEGER NOT NULL,
    number    INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    class     TEXT    NOT NULL,
    error     TEXT    NOT NULL,
    PRIMARY KEY (letter_id, ord)
);

CREATE TABLE idem_dead_letter_events (
    letter_id TEXT    NOT NULL REFERENCES idem_dead_letters (id),
    ord       INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    actor     TEXT    NOT NULL,
    action    TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    state     TEXT    NOT NULL,
    PRIMARY KEY (letter_id, ord)
);

CREATE TABLE idem_ledger_attempts (
    consumer  TEXT    NOT NULL,
    dedup_key TEXT    NOT NULL,
    ord       INTEGER NOT NULL,
    number    INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    class     TEXT    NOT NULL,
    error     TEXT    NOT NULL,
    PRIMARY KEY (consumer, dedup_key, ord)
);

CREATE TABLE idem_ledger_holds (
    consumer  TEXT NOT NULL,
    key       TEXT NOT NULL,
    letter_id TEXT NOT NULL,
    PRIMARY KEY (consumer, key)
);

-- seq keeps the parking order; the unique constraint keeps one copy of a
-- message parked twice.
CREATE TABLE idem_ledger_parked (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    id       TEXT    NOT NULL,
    topic    TEXT    NOT NULL,
    headers  TEXT,
    payload  BLOB,
    msg_time INTEGER NOT NULL,
    UNIQUE (consumer, id)
);
CREATE INDEX idem_ledger_parked_key ON idem_ledger_parked (consumer, key, seq);

-- The embedded transport: one log of every published message, ordered by
-- seq; per consumer name, a cursor (the last seq handed out) and the
-- messages handed out and not yet settled.
CREATE TABLE idem_transport_messages (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    topic    TEXT    NOT NULL,
    id       TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    headers  TEXT,
    payload  BLOB,
    msg_time INTEGER NOT NULL,
    -- published_at is the transport's clock at Publish, for Purge.
    published_at INTEGER NOT NULL
);
CREATE INDEX idem_transport_messages_topic ON idem_transport_messages (topic, seq);

CREATE TABLE idem_transport_consumers (
    topic    TEXT    NOT NULL,
    consumer TEXT    NOT NULL,
    cursor   INTEGER NOT NULL,
    PRIMARY KEY (topic, consumer)
);

-- visible_at is when the message may be handed out again: the end of the
-- holder's AckWait, or of a Nack's delay. owner names the delivery that
-- holds it (a stream and a number), NULL after a Nack or a Close.
CREATE TABLE idem_transport_pending (
    topic       TEXT    NOT NULL,
    consumer    TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    attempts    INTEGER NOT NULL,
    visible_at  INTEGER NOT NULL,
    owner       TEXT,
    owner_token INTEGER,
    PRIMARY KEY (topic, consumer, seq)
);
-- Purge asks whether any consumer still holds a message.
CREATE INDEX idem_transport_pending_seq ON idem_transport_pending (seq);
