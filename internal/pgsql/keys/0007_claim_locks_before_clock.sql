-- idem_claim as 0005 made it, but that it locks the key's row before it
-- reads the time. It used to read the time, then write the row, and the
-- write could wait for a transaction holding the row (a phase's
-- transaction that saved a recovery point, an application's transaction
-- that claimed or completed the key): a takeover that waited so got a
-- lease counted from before its wait, part or all of it gone when it
-- returned, and a duplicate could take the key over from a live
-- execution. Locking the row first costs the claims that must write
-- (takeovers, keys claimed anew) a row lock they took anyway with their
-- write; claims of new keys and answers do not run this function.
CREATE OR REPLACE FUNCTION idem_claim(
    p_scope text, p_key text, p_fingerprint text,
    p_lease_us bigint, p_ttl_us bigint, p_now timestamptz, p_async boolean,
    p_channel text, p_notify_id text,
    p_holder_replica text, p_holder_incarnation text)
RETURNS TABLE (
    o_outcome text, o_took_over boolean,
    o_fingerprint text, o_state text, o_token bigint, o_status integer, o_header jsonb,
    o_body bytea, o_body_omitted boolean, o_created_at timestamptz,
    o_lease_expires_at timestamptz, o_expires_at timestamptz, o_completed_at timestamptz,
    o_recovery_point text, o_recovery_data bytea, o_recovery_saved_at timestamptz,
    o_holder_replica text, o_holder_incarnation text)
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
        -- The row is locked first, waiting for any transaction that holds
        -- it, and the time is read after: a claim that waited must count
        -- its lease from when it writes, not from before its wait.
        SELECT * INTO r FROM idem_keys k WHERE k.scope = p_scope AND k.key = p_key FOR UPDATE;
        v_now := coalesce(p_now, clock_timestamp());


        IF NOT FOUND THEN
            -- A ClaimTx may hold the key with no row yet: wait for its
            -- transaction to end, then judge by the time after the wait.
            PERFORM pg_advisory_xact_lock(idem_key_lock(p_scope, p_key));
            v_now := coalesce(p_now, clock_timestamp());
            INSERT INTO idem_keys AS k
                (scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at,
                 holder_replica, holder_incarnation)
            VALUES (p_scope, p_key, p_fingerprint, 'in_flight', idem_clock_us(),
                v_now, v_now + v_lease, v_now + v_ttl, p_holder_replica, p_holder_incarnation)
            ON CONFLICT (scope, key) DO NOTHING
            RETURNING k.* INTO r;
            IF FOUND THEN
                v_outcome := 'acquired';
                EXIT;
            END IF;
            CONTINUE; -- inserted concurrently: look again
        END IF;

        IF r.expires_at <= v_now
           AND NOT (r.state = 'in_flight' AND (r.lease_expires_at > v_now OR r.recovery_point IS NOT NULL)) THEN
            -- Expired and not held: claimed anew, overwriting in place, so
            -- the row keeps its place.
            UPDATE idem_keys AS k SET
                fingerprint = p_fingerprint, state = 'in_flight',
                token = greatest(k.token + 1, idem_clock_us()),
                status = NULL, header = NULL, body = NULL, body_omitted = false,
                created_at = v_now, lease_expires_at = v_now + v_lease, expires_at = v_now + v_ttl,
                completed_at = NULL,
                recovery_point = NULL, recovery_data = NULL, recovery_saved_at = NULL,
                holder_replica = p_holder_replica, holder_incarnation = p_holder_incarnation
            WHERE k.scope = p_scope AND k.key = p_key AND k.token = r.token
              AND k.expires_at <= v_now
              AND NOT (k.state = 'in_flight' AND (k.lease_expires_at > v_now OR k.recovery_point IS NOT NULL))
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
            token = greatest(k.token + 1, idem_clock_us()), lease_expires_at = v_now + v_lease,
            holder_replica = p_holder_replica, holder_incarnation = p_holder_incarnation
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
    o_recovery_point := r.recovery_point;
    o_recovery_data := r.recovery_data;
    o_recovery_saved_at := r.recovery_saved_at;
    o_holder_replica := r.holder_replica;
    o_holder_incarnation := r.holder_incarnation;
    RETURN NEXT;
END
$$;
