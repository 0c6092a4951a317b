-- The CHECK on state cost every claim and completion more server time than
-- any other part of their statements: PostgreSQL parses and compiles a
-- table's CHECK expressions anew for each statement that writes a row
-- (pg_strtok, ExprEvalPushStep in a profile of the server), some 10µs a
-- statement on a small machine, where the claim's INSERT and the
-- completion's UPDATE take about as long. Only this package's statements
-- write state, each with one of the two constants, and the store refuses
-- any other value it reads ("stored state ... is unknown"), so the check
-- guarded nothing the code does not.
ALTER TABLE idem_keys DROP CONSTRAINT IF EXISTS idem_keys_state_check;
