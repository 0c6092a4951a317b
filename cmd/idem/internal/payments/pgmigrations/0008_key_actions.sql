-- The operators' actions on keys stopped at a recovery point (the
-- console's and idem keys' resume and settle): who, when, what, why.
-- Kept apart from the keys, whose records are purged in time.
CREATE TABLE key_actions (
    id     bigserial PRIMARY KEY,
    scope  text NOT NULL,
    key    text NOT NULL,
    at     timestamptz NOT NULL,
    actor  text NOT NULL,
    action text NOT NULL,
    reason text NOT NULL,
    result text NOT NULL
);
CREATE INDEX key_actions_key ON key_actions (scope, key, id);
