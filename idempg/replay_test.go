package idempg_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// TestReplayPreparedMatchesPgx checks that Replay's prepared path (the
// default) answers every kind of record as its pgx path does: a store on
// the same schema whose URL turns prepared statements off reads through
// pgx, with the same clock.
func TestReplayPreparedMatchesPgx(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	db := openDB(t, url, idempg.Config{Schema: schema})
	prepared := newStore(t, db)
	viaPgx := newStore(t, openDB(t, withExecMode(url), idempg.Config{Schema: schema}))
	ctx := t.Context()

	fp := idem.NewFingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1}`))
	other := idem.NewFingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":2}`))
	completed := map[idem.Key]idem.Response{
		"full": {Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "X-Many": {"a", "b"}},
			Body: []byte(`{"id":"pay_123"}`)},
		"no-header":  {Status: 204},
		"empty-body": {Status: 200, Body: []byte{}},
		"omitted":    {Status: 200, Header: map[string][]string{"Content-Type": {"text/plain"}}, BodyOmitted: true},
		"binary":     {Status: 200, Body: []byte{0, 1, 2, 0xff, '\\', 'x'}},
		"expired":    {Status: 201, Body: []byte("late")},
	}
	for key, resp := range completed {
		completeKey(t, prepared, key, fp, resp)
	}
	if _, err := prepared.Claim(ctx, idem.ClaimRequest{Key: "in-flight", Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool().Exec(ctx, `UPDATE idem_keys SET expires_at = now() - interval '1 minute' WHERE key = 'expired'`); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		Resp     *idem.Response
		Mismatch bool
	}
	for _, key := range []idem.Key{"full", "no-header", "empty-body", "omitted", "binary", "expired", "in-flight", "absent"} {
		for _, f := range []idem.Fingerprint{fp, other} {
			got, mismatch, err := prepared.Replay(ctx, "", key, f)
			if err != nil {
				t.Fatalf("prepared Replay(%s): %v", key, err)
			}
			want, wantMismatch, err := viaPgx.Replay(ctx, "", key, f)
			if err != nil {
				t.Fatalf("pgx Replay(%s): %v", key, err)
			}
			if !reflect.DeepEqual(answer{got, mismatch}, answer{want, wantMismatch}) {
				t.Errorf("Replay(%s, %s):\n prepared %s, mismatch %v\n pgx      %s, mismatch %v", key, f[:10], show(got), mismatch, show(want), wantMismatch)
			}
		}
	}
	// What the comparison stands on: the kinds of record answer as they should.
	if resp, _, _ := prepared.Replay(ctx, "", "full", fp); resp == nil || string(resp.Body) != `{"id":"pay_123"}` || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("full: %+v", resp)
	}
	if resp, _, _ := prepared.Replay(ctx, "", "empty-body", fp); resp == nil || resp.Body == nil {
		t.Errorf("empty-body: %s, want an empty, non-nil body", show(resp))
	}
	if resp, _, _ := prepared.Replay(ctx, "", "no-header", fp); resp == nil || resp.Header != nil || resp.Body != nil {
		t.Errorf("no-header: %+v, want no header and a nil body", resp)
	}
	for _, key := range []idem.Key{"expired", "in-flight", "absent"} {
		if resp, mismatch, _ := prepared.Replay(ctx, "", key, fp); resp != nil || mismatch {
			t.Errorf("%s: %+v, %v, want nothing to replay", key, resp, mismatch)
		}
	}
	if _, mismatch, _ := prepared.Replay(ctx, "", "full", other); !mismatch {
		t.Error("full with another fingerprint: no mismatch")
	}
}

// show prints a replayed response, or <nil>.
func show(r *idem.Response) string {
	if r == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%+v (body nil: %v)", *r, r.Body == nil)
}
