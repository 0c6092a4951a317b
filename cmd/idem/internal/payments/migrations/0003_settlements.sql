-- The settlement consumer's effect: per tenant and currency, the sum of the
-- payments it applied and how many. An increment, deliberately not
-- idempotent: only the consumer's inbox, which commits with it, keeps a
-- redelivered event from counting twice.
CREATE TABLE settlements (
    tenant   TEXT    NOT NULL,
    currency TEXT    NOT NULL,
    total    INTEGER NOT NULL,
    events   INTEGER NOT NULL,
    PRIMARY KEY (tenant, currency)
);
