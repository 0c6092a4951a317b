-- The operators' actions on keys stopped at a recovery point (the
-- console's and idem keys' resume and settle): who, when, what, why.
-- Kept apart from the keys, whose records are purged in time.
CREATE TABLE key_actions (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    scope  TEXT NOT NULL,
    key    TEXT NOT NULL,
    at     TEXT NOT NULL,
    actor  TEXT NOT NULL,
    action TEXT NOT NULL,
    reason TEXT NOT NULL,
    result TEXT NOT NULL
);
CREATE INDEX key_actions_key ON key_actions (scope, key, id);
