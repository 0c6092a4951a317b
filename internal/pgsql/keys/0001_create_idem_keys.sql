-- One row per idempotency key. completed_at and the response columns are
-- NULL while the key is in flight. scope and key compare bytewise (COLLATE
-- "C"): keys are opaque, and byte comparison is the cheapest.
CREATE TABLE idem_keys (
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    fingerprint      text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token            bigint      NOT NULL,
    status           integer,
    header           jsonb,
    body             bytea,
    body_omitted     boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
-- Room left on each page lets completion and takeover, which change no
-- indexed column, update rows in place (HOT) without touching the indexes.

-- Purge walks expired records in expires_at order through it.
CREATE INDEX idem_keys_expires_at ON idem_keys (expires_at);

-- idem_clock_us is the database's clock in microseconds since 1970. A new
-- fencing token is the greater of it, read when the row is written, and one
-- more than the key's previous token: so tokens grow per key while its row
-- lives, and stay above those of deleted rows as long as the database's
-- clock does not step back. (A sequence would not do: with synchronous_commit
-- off, a claim lost in a crash could see its value handed out again, to the
-- retry of the same request. See doc.go, "Fencing tokens".)
CREATE FUNCTION idem_clock_us() RETURNS bigint
LANGUAGE sql VOLATILE
RETURN (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

-- idem_claim is Store.Claim: one statement, so one round trip. It returns
-- the outcome ('acquired', 'in_flight', 'completed', 'mismatch'), whether
-- the claim took an ended lease over, and the record as the claim left or
-- found it.
--
-- Atomicity under READ COMMITTED: each statement below sees what was
-- committed before it started. A key that looks free is taken by a write
-- whose own condition PostgreSQL re-checks on the newest row version after
-- waiting for any concurrent writer (INSERT ... ON CONFLICT DO NOTHING for
-- an absent key, UPDATE ... WHERE <still expired> for an expired record or
-- an ended lease). Of many concurrent claimants exactly one such write
-- succeeds; the others find it did not and look again, now seeing the
-- winner's row. A key that looks taken is answered from the committed row
-- without a write, so duplicates and replays take no lock.
--
-- p_now is the injected clock's time, or NULL for the database's clock.
-- p_async turns synchronous_commit off for the rest of the transaction (see
-- doc.go for why losing a claim in a crash is harmless); Claim passes false
-- when it joins the caller's transaction, whose commit must stay durable.
-- p_channel and p_notify_id are what a takeover or an overwrite notifies,
-- for waiters.
CREATE FUNCTION idem_claim(
    p_scope text, p_key text, p_fingerprint text,
    p_lease_us bigint, p_ttl_us bigint, p_now timestamptz, p_async boolean,
    p_channel text, p_notify_id text)
RETURNS TABLE (
    o_outcome text, o_took_over boolean,
    o_fingerprint text, o_state text, o_token bigint, o_status integer, o_header jsonb,
    o_body bytea, o_body_omitted boolean, o_created_at timestamptz,
    o_lease_expires_at timestamptz, o_expires_at timestamptz, o_completed_at timestamptz)
LANGUAGE plpgsql
-- Table names resolve in the schema the function was created in, whatever
-- the caller's search_path.
SET search_path FROM CURRENT
AS $$
DECLARE
    v_lease   interval := p_lease_us * interval '1 microsecond';
    v_ttl     interval := p_ttl_us * interval '1 microsecond';
    v_now     timestamptz;
    v_outcome text;
    v_took    boolean := false;
    r         idem_keys%ROWTYPE;
BEGIN
    IF p_async THEN
        -- Local to the transaction (the statement's own, implicit one):
        -- a SET clause on the function would be undone before COMMIT.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    -- Each pass either decides or finds that a concurrent writer changed
    -- the key since it looked; a pass can only lose to a writer that made
    -- progress, so a few passes suffice.
    FOR attempt IN 1..100 LOOP
        v_now := coalesce(p_now, clock_timestamp());

        SELECT * INTO r FROM idem_keys k WHERE k.scope = p_scope AND k.key = p_key;


        IF NOT FOUND THEN
            INSERT INTO idem_keys AS k
                (scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at)
            VALUES (p_scope, p_key, p_fingerprint, 'in_flight', idem_clock_us(),
                v_now, v_now + v_lease, v_now + v_ttl)
            ON CONFLICT (scope, key) DO NOTHING
            RETURNING k.* INTO r;
            IF FOUND THEN
                v_outcome := 'acquired';
                EXIT;
            END IF;
            CONTINUE; -- inserted concurrently: look again
        END IF;

        IF r.expires_at <= v_now AND NOT (r.state = 'in_flight' AND r.lease_expires_at > v_now) THEN
            -- Expired and not held: claimed anew, overwriting in place, so
            -- the row keeps its place.
            UPDATE idem_keys AS k SET
                fingerprint = p_fingerprint, state = 'in_flight',
                token = greatest(k.token + 1, idem_clock_us()),
                status = NULL, header = NULL, body = NULL, body_omitted = false,
                created_at = v_now, lease_expires_at = v_now + v_lease, expires_at = v_now + v_ttl,
                completed_at = NULL
            WHERE k.scope = p_scope AND k.key = p_key AND k.token = r.token
              AND k.expires_at <= v_now AND NOT (k.state = 'in_flight' AND k.lease_expires_at > v_now)
            RETURNING k.* INTO r;
            IF FOUND THEN
                PERFORM pg_notify(p_channel, p_notify_id);
                v_outcome := 'acquired';
                EXIT;
            END IF;
            CONTINUE;
        END IF;

        IF r.fingerprint <> p_fingerprint THEN
            v_outcome := 'mismatch';
            EXIT;
        ELSIF r.state = 'completed' THEN
            v_outcome := 'completed';
            EXIT;
        ELSIF r.lease_expires_at > v_now THEN
            v_outcome := 'in_flight';
            EXIT;
        END IF;

        -- In flight under an ended lease, same request: take it over.
        UPDATE idem_keys AS k SET
            token = greatest(k.token + 1, idem_clock_us()), lease_expires_at = v_now + v_lease
        WHERE k.scope = p_scope AND k.key = p_key AND k.token = r.token
          AND k.state = 'in_flight' AND k.lease_expires_at <= v_now
        RETURNING k.* INTO r;
        IF FOUND THEN
            PERFORM pg_notify(p_channel, p_notify_id);
            v_outcome := 'acquired';
            v_took := true;
            EXIT;
        END IF;
    END LOOP;

    IF v_outcome IS NULL THEN
        RAISE EXCEPTION 'idem_claim: key changed under 100 successive attempts'
            USING ERRCODE = 'serialization_failure';
    END IF;

    o_outcome := v_outcome;
    o_took_over := v_took;
    o_fingerprint := r.fingerprint;
    o_state := r.state;
    o_token := r.token;
    o_status := r.status;
    o_header := r.header;
    o_body := r.body;
    o_body_omitted := r.body_omitted;
    o_created_at := r.created_at;
    o_lease_expires_at := r.lease_expires_at;
    o_expires_at := r.expires_at;
    o_completed_at := r.completed_at;
    RETURN NEXT;
END
$$;
