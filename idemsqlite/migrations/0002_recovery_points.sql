-- Recovery points (idem.Recoverer): how far an execution of the key got,
-- saved in the transaction of each phase's own writes. NULL: none. A key
-- claimed anew clears them; a takeover keeps them.
ALTER TABLE idem_keys ADD COLUMN recovery_point TEXT;
ALTER TABLE idem_keys ADD COLUMN recovery_data BLOB;
ALTER TABLE idem_keys ADD COLUMN recovery_saved_at INTEGER;

-- Abandoned finds the keys in flight with a point, oldest lease end
-- first; the index holds only those, so it stays small.
CREATE INDEX idem_keys_recovering ON idem_keys (lease_expires_at)
    WHERE state = 'in_flight' AND recovery_point IS NOT NULL;
