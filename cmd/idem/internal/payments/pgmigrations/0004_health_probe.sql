-- One row that /readyz writes and commits, so that readiness means "a write
-- is durable", not merely "the server answers".
CREATE TABLE health_probe (
    id         integer PRIMARY KEY CHECK (id = 1),
    written_at timestamptz NOT NULL
);
