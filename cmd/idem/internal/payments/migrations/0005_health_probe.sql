-- One row that /readyz writes and commits, so that readiness means "a write
-- reaches the disk", not merely "the file opens".
CREATE TABLE health_probe (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    written_at INTEGER NOT NULL
);
