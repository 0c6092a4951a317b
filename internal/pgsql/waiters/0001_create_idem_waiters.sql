-- One row per duplicate waiting for a key to change (Store.WaitChange),
-- from its registration until it stops waiting. Completions and releases
-- notify a key only when it has a row here, so the commits of keys nobody
-- waits for never take the lock that NOTIFY holds through commit (one
-- database-wide lock, which would otherwise serialise every completing
-- commit). UNLOGGED: the rows are short-lived and writing them costs no WAL;
-- a server crash empties the table, and every waiter then wakes anyway when
-- its LISTEN connection drops. until is the lease end the waiter waits for
-- at most; Purge deletes rows past it, left by a process that died waiting.
CREATE UNLOGGED TABLE idem_waiters (
    scope  text COLLATE "C" NOT NULL,
    key    text COLLATE "C" NOT NULL,
    waiter bigint      NOT NULL,
    until  timestamptz NOT NULL,
    PRIMARY KEY (scope, key, waiter)
);

-- idem_refuse_completion aborts the transaction of a completion that found
-- the key not held under its token, so that the COMMIT sent in the same
-- pipeline (see Store.CompleteTx) commits nothing. Its SQLSTATE, IDM01,
-- tells the store it was this refusal.
CREATE FUNCTION idem_refuse_completion() RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'idem: the key is not held under this fencing token'
        USING ERRCODE = 'IDM01';
END
$$;
