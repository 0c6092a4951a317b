-- The message tables: inbox, outbox, dead letters and the consumer's
-- ledger. Names compare bytewise (COLLATE "C"): they are opaque
-- identifiers, and byte comparison is the cheapest. Headers are a jsonb
-- object, NULL when there are none; when a key or value is not valid UTF-8
-- or holds a NUL byte (which jsonb cannot store), every key and value is
-- base64-encoded and headers_base64 is true. Times are timestamptz
-- (microseconds); a zero Go time is NULL.

-- One row per message a consumer has processed, written in the transaction
-- of the handler's effect. Kept at least as long as the transport can
-- redeliver the message; Inbox.PurgeInbox deletes older ones.
CREATE TABLE idem_inbox (
    consumer     text COLLATE "C" NOT NULL,
    dedup_key    text COLLATE "C" NOT NULL,
    processed_at timestamptz      NOT NULL,
    PRIMARY KEY (consumer, dedup_key)
);
CREATE INDEX idem_inbox_processed_at ON idem_inbox (processed_at);

-- Messages written with the effect they announce, until a relay has
-- published them (MarkSent deletes them). lease_until is NULL while no relay
-- holds the entry. Claim walks the primary key in seq order.
CREATE TABLE idem_outbox (
    seq            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id             text        NOT NULL,
    topic          text        NOT NULL,
    key            text        NOT NULL,
    headers        jsonb,
    headers_base64 boolean     NOT NULL DEFAULT false,
    payload        bytea       NOT NULL,
    msg_time       timestamptz,
    created_at     timestamptz NOT NULL,
    relay          text,
    lease_until    timestamptz
);

-- Dead letters are never deleted. added orders letters that failed last at
-- the same time.
CREATE TABLE idem_dead_letters (
    id              text COLLATE "C" PRIMARY KEY,
    added           bigint GENERATED ALWAYS AS IDENTITY,
    consumer        text        NOT NULL,
    message_id      text        NOT NULL,
    topic           text        NOT NULL,
    key             text        NOT NULL,
    headers         jsonb,
    headers_base64  boolean     NOT NULL DEFAULT false,
    payload         bytea       NOT NULL,
    msg_time        timestamptz,
    class           text        NOT NULL CHECK (class IN ('permanent', 'exhausted')),
    state           text        NOT NULL CHECK (state IN ('dead', 'redriven', 'discarded')),
    first_failed_at timestamptz,
    last_failed_at  timestamptz
);
CREATE INDEX idem_dead_letters_last ON idem_dead_letters (last_failed_at DESC NULLS LAST, added DESC);
CREATE INDEX idem_dead_letters_state ON idem_dead_letters (state, consumer);

CREATE TABLE idem_dead_letter_attempts (
    letter_id text COLLATE "C" NOT NULL REFERENCES idem_dead_letters (id),
    ord       integer     NOT NULL,
    number    integer     NOT NULL,
    at        timestamptz,
    class     text        NOT NULL,
    error     text        NOT NULL,
    PRIMARY KEY (letter_id, ord)
);

CREATE TABLE idem_dead_letter_events (
    letter_id text COLLATE "C" NOT NULL REFERENCES idem_dead_letters (id),
    ord       integer     NOT NULL,
    at        timestamptz,
    actor     text        NOT NULL,
    action    text        NOT NULL,
    reason    text        NOT NULL,
    state     text        NOT NULL,
    PRIMARY KEY (letter_id, ord)
);

-- A consumer's failed attempts of messages not yet settled, in the order
-- they were recorded (seq).
CREATE TABLE idem_ledger_attempts (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer  text COLLATE "C" NOT NULL,
    dedup_key text COLLATE "C" NOT NULL,
    number    integer     NOT NULL,
    at        timestamptz,
    class     text        NOT NULL,
    error     text        NOT NULL
);
CREATE INDEX idem_ledger_attempts_message ON idem_ledger_attempts (consumer, dedup_key, seq);

CREATE TABLE idem_ledger_holds (
    consumer  text COLLATE "C" NOT NULL,
    key       text COLLATE "C" NOT NULL,
    letter_id text NOT NULL,
    PRIMARY KEY (consumer, key)
);

-- seq keeps the parking order; the unique constraint keeps one copy of a
-- message parked twice.
CREATE TABLE idem_ledger_parked (
    seq            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer       text COLLATE "C" NOT NULL,
    key            text COLLATE "C" NOT NULL,
    id             text COLLATE "C" NOT NULL,
    topic          text        NOT NULL,
    headers        jsonb,
    headers_base64 boolean     NOT NULL DEFAULT false,
    payload        bytea       NOT NULL,
    msg_time       timestamptz,
    UNIQUE (consumer, id)
);
CREATE INDEX idem_ledger_parked_key ON idem_ledger_parked (consumer, key, seq);
