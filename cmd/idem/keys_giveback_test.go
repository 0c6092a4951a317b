package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// refuseYield makes the key store of the database dbArgs name refuse, or
// accept again, the giving back of a key (a Yield: its lease ended early),
// as a store that fails does. times bounds the Yields refused, on
// PostgreSQL, whose sequences count outside the transactions the refusals
// roll back; on SQLite every Yield is refused (times is ignored).
func refuseYield(t *testing.T, dbArgs []string, refuse bool, times int) {
	t.Helper()
	schema := ""
	if len(dbArgs) == 4 {
		schema = dbArgs[3]
	}
	db, err := openDB(t.Context(), dbArgs[1], schema, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.pg != nil {
		stmt := `DROP TRIGGER refuse_yield ON idem_keys; DROP SEQUENCE yield_refusals`
		if refuse {
			stmt = fmt.Sprintf(`CREATE SEQUENCE yield_refusals;
				CREATE OR REPLACE FUNCTION refuse_yield() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN
					IF NEW.state = 'in_flight' AND NEW.lease_expires_at < OLD.lease_expires_at AND nextval('yield_refusals') <= %d THEN
						RAISE EXCEPTION 'the store refuses the yield';
					END IF;
					RETURN NEW;
				END$$;
				CREATE TRIGGER refuse_yield BEFORE UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION refuse_yield()`, times)
		}
		_, err = db.pg.Pool().Exec(t.Context(), stmt)
	} else {
		stmt := `DROP TRIGGER refuse_yield`
		if refuse {
			stmt = `CREATE TRIGGER refuse_yield BEFORE UPDATE ON idem_keys
				WHEN NEW.state = 'in_flight' AND NEW.lease_expires_at < OLD.lease_expires_at
				BEGIN SELECT RAISE(ABORT, 'the store refuses the yield'); END`
		}
		_, err = db.sqlite.Writer().ExecContext(t.Context(), stmt)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// A settle whose history entry fails is not taken, and its give-back (a
// Yield) failing too leaves the key held under the lease the command's
// settle took, which nobody renews or gives back once the command has
// ended: the command gives the key back (LetGo) before it ends, and when
// it cannot, says that the key stays held until that lease ends, and
// when. A failed settle is never left holding the key silently.
func TestKeysSettleGivesBackTheKeyItHolds(t *testing.T) {
	t.Parallel()
	for name, dbArgs := range map[string]func(t *testing.T) []string{
		"sqlite": func(t *testing.T) []string {
			return []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}
		},
		"postgres": func(t *testing.T) []string {
			u := postgresURL(t)
			return []string{"--db", u, "--pg-schema", freshSchema(t, u)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := dbArgs(t)
			if code, _, errOut := runCmd(t, append([]string{"migrate"}, args...)...); code != exitOK {
				t.Fatalf("migrate: exit %d, %q", code, errOut)
			}
			store, _, done := openTestDB(t, args)
			for _, key := range []idem.Key{"pay-1", "pay-2"} {
				c, err := store.Claim(t.Context(), idem.ClaimRequest{Scope: "acme", Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: 24 * time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				ref := idem.Ref{Scope: "acme", Key: key, Token: c.Token}
				if err := store.SaveRecovery(t.Context(), ref, idem.RecoveryPoint{Name: "charging", Data: []byte("{}")}); err != nil {
					t.Fatal(err)
				}
				// Its holder gone: in flight at its point, its lease ended.
				if err := store.Yield(t.Context(), ref); err != nil {
					t.Fatal(err)
				}
			}
			done()
			state := func(key idem.Key) idem.Record {
				t.Helper()
				s, _, done := openTestDB(t, args)
				defer done()
				rec, err := s.Get(t.Context(), "acme", key)
				if err != nil {
					t.Fatal(err)
				}
				return rec
			}
			settle := func(key idem.Key) (int, string, string) {
				return runCmd(t, append([]string{"keys", "settle", "--scope", "acme", "--operator", "alice", string(key), "--reason", "no charge at the network", "--failed"}, args...)...)
			}
			refuseHistory(t, args, true)

			// The store refuses every Yield: the key stays held, and the
			// command says until when.
			refuseYield(t, args, true, 1000)
			code, out, errOut := settle("pay-1")
			rec := state("pay-1")
			if rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || !rec.LeaseExpiresAt.After(time.Now()) {
				t.Fatalf("pay-1 after a settle whose entry and Yield failed: %v %q, lease until %v; want it in flight at its point, held", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt)
			}
			until := rec.LeaseExpiresAt.UTC().Format(time.RFC3339)
			if code != exitFailure || !strings.Contains(errOut, "could not be recorded") || !strings.Contains(errOut, "stays held") || !strings.Contains(errOut, until) {
				t.Errorf("keys settle whose entry and give-back failed: exit %d, %q, %q; want a failure saying the key stays held until %s", code, out, errOut, until)
			}
			refuseYield(t, args, false, 0)

			if name != "postgres" {
				return
			}
			// The store refuses the settle's own Yield alone: the command
			// gives the key back, its lease ended, as it was.
			refuseYield(t, args, true, 1)
			code, out, errOut = settle("pay-2")
			if rec := state("pay-2"); rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || rec.LeaseExpiresAt.After(time.Now()) {
				t.Errorf("pay-2 after a settle whose entry and first Yield failed: %v %q, lease until %v; want it given back, in flight at its point, its lease ended", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt)
			}
			if code != exitFailure || !strings.Contains(errOut, "could not be recorded") || !strings.Contains(errOut, "nothing was changed") || strings.Contains(errOut, "stays held") {
				t.Errorf("keys settle whose entry failed, the key given back: exit %d, %q, %q; want a failure saying nothing was changed", code, out, errOut)
			}
		})
	}
}
