-- Lists walk payments and deposits by (account_id, created_at, id), the
-- indexes 0006 made, of which (account_id, created_at) is a prefix: the
-- first indexes serve no query since, and every payment and deposit paid
-- for keeping them up to date.
DROP INDEX payments_account_created;
DROP INDEX deposits_account_created;
