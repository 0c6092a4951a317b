package idemgrpc_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// An operator's settle of a call stopped at a recovery point keeps the
// answer in gRPC's form, so that the client's retry gets it replayed: a
// status whose code means the answer's HTTP status (DefaultSettle), its
// message the problem's title and detail, the answer's headers as header
// metadata; or, with a CompleterConfig.Settle, the message it makes of a
// 2xx. DefaultSettle refuses a 2xx (it cannot know the method's message),
// leaving the key as it was. With and without body keys (the answer then
// kept in a sealed envelope).
func TestSettleKeepsAnAnswerTheRetryReads(t *testing.T) {
	t.Parallel()
	for name, keys := range map[string][]keyed.BodyKey{"clear": nil, "sealed": {{ID: "k1", Key: []byte("0123456789abcdef0123456789abcdef")}}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := idemmem.NewStore(nil)
			ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SharedScope: true, Default: idemgrpc.Required, BodyKeys: keys})
			if err != nil {
				t.Fatal(err)
			}
			call := stoppedCalls(t, ic)
			for _, key := range []string{"failed", "ok-default", "ok-app"} {
				if _, _, err := call(key); status.Code(err) != codes.Unavailable {
					t.Fatalf("the first call of %s: %v; want it stopped at its point, Unavailable", key, err)
				}
			}
			resume := func(context.Context, idemgrpc.Execution) (any, error) { return nil, errors.New("not here") }
			byDefault, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: resume})
			if err != nil {
				t.Fatal(err)
			}
			byApp, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: resume, Settle: func(answer idem.Response) (any, error) {
				return structpb.NewStruct(map[string]any{"settled": string(answer.Body)})
			}})
			if err != nil {
				t.Fatal(err)
			}

			failed := idem.Response{Status: http.StatusConflict, Body: []byte(`{"title":"Settled as failed by an operator","detail":"Send it again under a new key."}`),
				Header: http.Header{"Content-Type": {"application/problem+json"}, "Idem-Settled-By-Operator": {"failed"}}}
			if _, err := byDefault.Settle(t.Context(), "", "failed", failed, false); err != nil {
				t.Fatal(err)
			}
			_, md, err := call("failed")
			if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "Settled as failed by an operator: Send it again under a new key." ||
				len(md.Get("idem-settled-by-operator")) != 1 || md.Get("idem-settled-by-operator")[0] != "failed" || len(md.Get(idemgrpc.MetadataReplayed)) != 1 {
				t.Fatalf("the retry of the key settled as failed: %v, metadata %v; want FailedPrecondition, replayed, marked settled", err, md)
			}

			ok := idem.Response{Status: http.StatusCreated, Body: []byte(`{"id":"p1"}`), Header: http.Header{"Content-Type": {"application/json"}, "Idem-Settled-By-Operator": {"answer"}}}
			before, _ := store.Get(t.Context(), "", "ok-default")
			if _, err := byDefault.Settle(t.Context(), "", "ok-default", ok, false); !errors.Is(err, idemgrpc.ErrSettleNeedsMessage) || !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("DefaultSettle of a 201: %v; want ErrSettleNeedsMessage, an invalid argument", err)
			}
			if after, err := store.Get(t.Context(), "", "ok-default"); err != nil || after.State != idem.StateInFlight || after.Token != before.Token || after.Recovery.Name != "charging" {
				t.Fatalf("the key after a refused settle: %+v, %v; want it as it was", after, err)
			}

			if _, err := byApp.Settle(t.Context(), "", "ok-app", ok, false); err != nil {
				t.Fatal(err)
			}
			out, md, err := call("ok-app")
			if err != nil || out.GetFields()["settled"].GetStringValue() != `{"id":"p1"}` || len(md.Get("idem-settled-by-operator")) != 1 {
				t.Fatalf("the retry of the key settled with the application's message: %v, %v, metadata %v", out, err, md)
			}
		})
	}
}

// DefaultSettle's codes: what an HTTP status an operator gives means to a
// gRPC client, at each edge of the ranges: a 2xx is OK, a 4xx without a
// code of its own FailedPrecondition (the call will not succeed under this
// key), a 5xx without one, and anything outside 2xx, 4xx and 5xx, Internal.
func TestSettleCode(t *testing.T) {
	t.Parallel()
	for httpStatus, want := range map[int]codes.Code{0: codes.Internal, 100: codes.Internal, 199: codes.Internal,
		200: codes.OK, 201: codes.OK, 299: codes.OK, 300: codes.Internal, 304: codes.Internal, 399: codes.Internal,
		400: codes.InvalidArgument, 401: codes.Unauthenticated, 402: codes.FailedPrecondition, 403: codes.PermissionDenied, 404: codes.NotFound,
		405: codes.FailedPrecondition, 409: codes.FailedPrecondition, 410: codes.NotFound, 413: codes.InvalidArgument, 422: codes.FailedPrecondition,
		429: codes.ResourceExhausted, 498: codes.FailedPrecondition, 499: codes.Canceled,
		500: codes.Internal, 501: codes.Unimplemented, 502: codes.Unavailable, 503: codes.Unavailable, 504: codes.DeadlineExceeded, 505: codes.Internal, 599: codes.Internal, 600: codes.Internal} {
		if got := idemgrpc.SettleCode(httpStatus); got != want {
			t.Errorf("SettleCode(%d) = %v; want %v", httpStatus, got, want)
		}
	}
	if _, err := idemgrpc.DefaultSettle(idem.Response{Status: 503, Body: []byte("down for maintenance\n")}); status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "down for maintenance" {
		t.Errorf("DefaultSettle of a 503 in plain text: %v", err)
	}
}
