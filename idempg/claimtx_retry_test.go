package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// At REPEATABLE READ and SERIALIZABLE, ClaimTx begins again after a
// serialization failure of its claim (a key another transaction committed
// after its snapshot), MaxClaimTxAttempts times in all and no more: a key
// whose every claim fails so returns that failure, as a PostgreSQL error
// the caller can tell apart, having run no work and written no row.
func TestClaimTxGivesUpAfterItsLastSerializationFailure(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			db := openDB(t, url, idempg.Config{TxOptions: pgx.TxOptions{IsoLevel: iso}})
			store := newStore(t, db)
			// Every insert of a key fails as a claim racing a committed
			// key does; a sequence, which no rollback undoes, counts them.
			if _, err := db.Pool().Exec(t.Context(), `
				CREATE SEQUENCE claim_inserts;
				CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					PERFORM nextval('claim_inserts');
					RAISE EXCEPTION 'the key was committed after this snapshot' USING ERRCODE = 'serialization_failure';
				END $$;
				CREATE TRIGGER refuse_claims BEFORE INSERT ON idem_keys FOR EACH ROW EXECUTE FUNCTION refuse_claim();`); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			ran := false
			req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			_, kept, err := store.ClaimTx(ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
				ran = true
				return idem.Response{Status: 201}, true, nil
			})
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "40001" || kept || ran {
				t.Fatalf("ClaimTx of a key whose every claim fails to serialize = kept %v, work run %v, %v; want the serialization failure, no work", kept, ran, err)
			}
			var attempts int64
			if err := db.Pool().QueryRow(t.Context(), `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM claim_inserts`).Scan(&attempts); err != nil {
				t.Fatal(err)
			}
			if attempts != idempg.MaxClaimTxAttempts {
				t.Errorf("%d claims tried, want %d", attempts, idempg.MaxClaimTxAttempts)
			}
			if _, err := store.Get(t.Context(), req.Scope, req.Key); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("the key after ClaimTx gave up: %v, want ErrNotFound", err)
			}
		})
	}
}

// A key ClaimTx must write to claim (its lease ended) is claimed in the
// transaction its work then runs in, and that claim leaves the
// transaction's synchronous_commit as the server has it: the work's
// effects and the completion commit as durably as the caller's other
// transactions. Only a claim that commits alone may commit asynchronously.
func TestClaimTxOfAnExistingKeyKeepsSynchronousCommit(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	for _, iso := range isolationLevels {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(idemtest.Start)
			db := openDB(t, url, idempg.Config{Clock: clock, TxOptions: pgx.TxOptions{IsoLevel: iso}})
			store := newStore(t, db)
			var serverDefault string
			if err := db.Pool().QueryRow(t.Context(), `SHOW synchronous_commit`).Scan(&serverDefault); err != nil {
				t.Fatal(err)
			}
			if serverDefault == "off" {
				t.Fatal("the server runs with synchronous_commit=off: this test cannot tell the claim's setting apart")
			}
			req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			mustClaim(t, store, req)
			clock.Advance(req.Lease + time.Second)
			var setting string
			c, kept, err := store.ClaimTx(t.Context(), req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
				err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
					return tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting)
				})
				return idem.Response{Status: 201}, true, err
			})
			if err != nil || !kept || c.Outcome != idem.Acquired || !c.TookOver {
				t.Fatalf("ClaimTx of a key whose lease ended = %v (took over %v), kept %v, %v; want acquired, taken over", c.Outcome, c.TookOver, kept, err)
			}
			if setting != serverDefault {
				t.Errorf("synchronous_commit in the work's transaction %q, want the server's %q", setting, serverDefault)
			}
		})
	}
}
