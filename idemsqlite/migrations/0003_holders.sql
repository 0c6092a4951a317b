-- Holders (idem.Holder): the replica and the incarnation (one run of its
-- process) whose claim gave the key its current token. NULL: anonymous.
ALTER TABLE idem_keys ADD COLUMN holder_replica TEXT;
ALTER TABLE idem_keys ADD COLUMN holder_incarnation TEXT;

-- YieldEarlier finds a replica's keys in flight through it; the index
-- holds only keys in flight under a named holder, so it stays small.
CREATE INDEX idem_keys_holders ON idem_keys (holder_replica)
    WHERE state = 'in_flight' AND holder_replica IS NOT NULL;
