-- Lists walk payments and deposits by (account_id, created_at, id), the
-- indexes 0005 made. The first indexes on (account_id, created_at, ...)
-- serve no query since, and every payment and deposit paid for keeping
-- them up to date.
DROP INDEX payments_account_created;
DROP INDEX deposits_account_created;
