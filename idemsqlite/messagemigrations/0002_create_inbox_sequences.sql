-- One row per (consumer, aggregate) that a consumer de-duplicates by
-- sequence number (Inbox.ProcessSequence): mark is the highest sequence
-- number processed, raised in the transaction of the handler's effect.
-- SQLite's INTEGER is signed, so mark holds the uint64's bits: numbers past
-- 2^63-1 read as negative here, and come back exact through the Inbox.
-- updated_at is unix nanoseconds. Marks are never purged: a mark that went
-- would let every earlier message of its aggregate run again, and the
-- table grows with the aggregates, not with the messages.
CREATE TABLE idem_inbox_sequences (
    consumer   TEXT    NOT NULL,
    aggregate  TEXT    NOT NULL,
    mark       INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, aggregate)
);
