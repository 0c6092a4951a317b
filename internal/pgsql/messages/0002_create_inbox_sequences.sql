-- One row per (consumer, aggregate) that a consumer de-duplicates by
-- sequence number (Inbox.ProcessSequence): mark is the highest sequence
-- number processed, raised in the transaction of the handler's effect, and
-- the row is locked (SELECT ... FOR UPDATE) from the look at the mark to
-- that commit. numeric(20, 0) holds every uint64 exactly, where bigint
-- stops at 2^63-1. Marks are never purged: a mark that went would let
-- every earlier message of its aggregate run again, and the table grows
-- with the aggregates, not with the messages.
CREATE TABLE idem_inbox_sequences (
    consumer   text COLLATE "C" NOT NULL,
    aggregate  text COLLATE "C" NOT NULL,
    mark       numeric(20, 0)   NOT NULL CHECK (mark >= 0 AND mark <= 18446744073709551615),
    updated_at timestamptz      NOT NULL,
    PRIMARY KEY (consumer, aggregate)
);
