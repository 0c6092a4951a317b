-- A payment made at a card network (idem serve --acquirer) records the
-- network's charge; one charge pays for one payment at most.
ALTER TABLE payments ADD COLUMN charge_id text;
CREATE UNIQUE INDEX payments_charge ON payments (charge_id) WHERE charge_id IS NOT NULL;
