package idemgrpc_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// With BodyKeys, a kept answer's message, status message, details and
// replayed metadata are nowhere in the store in clear, and a replay gives
// them all back; with DiscardBodies, none of the message, status message
// and details is kept, and a replay gives the code and the replayed
// metadata, which is kept.
func TestAnswersAtRest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		cfg     idemgrpc.Config
		discard bool
	}{
		{"BodyKeys", idemgrpc.Config{BodyKeys: []keyed.BodyKey{{ID: "k1", Key: []byte("0123456789abcdef0123456789abcdef")}}}, false},
		{"DiscardBodies", idemgrpc.Config{DiscardBodies: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := idemmem.NewStore(nil)
			cfg := tc.cfg
			cfg.Store, cfg.SharedScope, cfg.ReplayMetadata, cfg.MemoryReplayFor = store, true, []string{"x-receipt"}, -1
			h := grpcsuite.New(t, cfg, nil)
			h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
				grpc.SetHeader(ctx, metadata.Pairs("x-receipt", "secret-receipt"))
				if req.Fields["refuse"].GetBoolValue() {
					st, _ := status.New(codes.FailedPrecondition, "secret-refusal").WithDetails(&errdetails.ErrorInfo{Reason: "SECRET_DETAIL"})
					return nil, st.Err()
				}
				return grpcsuite.Msg(t, map[string]any{"answer": "secret-answer"}), nil
			})
			ctx := t.Context()
			ok := grpcsuite.Msg(t, map[string]any{"refuse": false})
			refuse := grpcsuite.Msg(t, map[string]any{"refuse": true})
			first, _, err := h.Call(ctx, "ok-1", ok)
			if err != nil || first.Fields["answer"].GetStringValue() != "secret-answer" {
				t.Fatalf("first call: %v, %v", first, err)
			}
			if _, _, err := h.Call(ctx, "err-1", refuse); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("first refused call: %v", err)
			}
			h.WaitEnds(t, 2)
			secrets := []string{"secret-answer", "secret-refusal", "SECRET_DETAIL", "U0VDUkVUX0RFVEFJTA"}
			if !tc.discard {
				secrets = append(secrets, "secret-receipt")
			}
			for _, key := range []idem.Key{"ok-1", "err-1"} {
				rec, err := store.Get(ctx, "", key)
				if err != nil || rec.Response == nil {
					t.Fatalf("%s: %+v, %v", key, rec, err)
				}
				kept := string(rec.Response.Body)
				for name, vals := range rec.Response.Header {
					kept += "\n" + name + ": " + strings.Join(vals, ",")
				}
				for _, s := range secrets {
					if strings.Contains(kept, s) {
						t.Errorf("the store keeps %s's answer with %q in clear:\n%s", key, s, kept)
					}
				}
			}

			again, md, err := h.Call(ctx, "ok-1", ok)
			switch {
			case err != nil:
				t.Fatalf("replay: %v", err)
			case tc.discard && (len(again.Fields) != 0 || len(md[idemgrpc.MetadataBodyOmitted]) == 0 || strings.Join(md["x-receipt"], "") != "secret-receipt"):
				t.Fatalf("replay with DiscardBodies: %v, %v; want an empty message marked omitted, with its metadata", again, md)
			case !tc.discard && (again.Fields["answer"].GetStringValue() != "secret-answer" || strings.Join(md["x-receipt"], "") != "secret-receipt"):
				t.Fatalf("replay: %v, %v; want the answer and its metadata", again, md)
			}
			_, _, err = h.Call(ctx, "err-1", refuse)
			st := status.Convert(err)
			switch {
			case st.Code() != codes.FailedPrecondition:
				t.Fatalf("replayed refusal: %v", err)
			case !tc.discard && (st.Message() != "secret-refusal" || len(st.Details()) != 1):
				t.Fatalf("replayed refusal: %v %v; want its message and details", st.Message(), st.Details())
			}
		})
	}
}
