-- The settlement consumer's effect: per tenant and currency, the sum of the
-- payments it applied and how many. An increment, deliberately not
-- idempotent: only the consumer's inbox, which commits with it, keeps a
-- redelivered event from counting twice.
CREATE TABLE settlements (
    tenant   text   NOT NULL,
    currency text   NOT NULL,
    total    bigint NOT NULL,
    events   bigint NOT NULL,
    PRIMARY KEY (tenant, currency)
);
