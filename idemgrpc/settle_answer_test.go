package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
)

// stoppedCalls serves a method whose handler stops every call at the
// recovery point "charging" (Unavailable), as a holder that died there
// leaves its key, and returns a call of it under a key: the message, the
// status and the header metadata the client gets. A call the key's replay
// answers never reaches the handler; one that does is stopped again.
func stoppedCalls(t *testing.T, ic *idemgrpc.Interceptor) func(key string) (*structpb.Struct, metadata.MD, error) {
	t.Helper()
	desc := grpc.ServiceDesc{ServiceName: "idemgrpc.test.Settled", HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{{MethodName: "Charge",
		Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/idemgrpc.test.Settled/Charge"}, func(ctx context.Context, _ any) (any, error) {
				if err := idemgrpc.SaveRecovery(ctx, "charging", []byte("ch")); err != nil {
					return nil, err
				}
				return nil, status.Error(codes.Unavailable, "the card network does not answer")
			})
		}}}}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	srv.RegisterService(&desc, nil)
	lis := bufconn.Listen(1 << 20)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	conn, err := grpc.NewClient("passthrough:///settled", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return func(key string) (*structpb.Struct, metadata.MD, error) {
		out, md := new(structpb.Struct), metadata.MD{}
		ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, key)
		err := conn.Invoke(ctx, "/idemgrpc.test.Settled/Charge", &structpb.Struct{}, out, grpc.Header(&md))
		return out, md, err
	}
}

// What a gRPC client gets when it retries a call an operator settled with
// DefaultSettle: the code SettleCode gives the answer's HTTP status, and a
// message made of the answer. A problem document (RFC 9457, a JSON
// Content-Type) gives its title and detail, either alone when the other is
// empty; any other body gives its text, trimmed and cut at 1024 bytes
// (never inside a character; a byte that is not UTF-8 reads as U+FFFD), and
// an empty one the status's text.
func TestSettledAnswerAsTheClientReadsIt(t *testing.T) {
	t.Parallel()
	problem := http.Header{"Content-Type": {"application/problem+json"}}
	text := http.Header{"Content-Type": {"text/plain; charset=utf-8"}}
	long := strings.Repeat("a", 1024)
	for _, c := range []struct {
		name     string
		status   int
		header   http.Header
		body     string
		wantCode codes.Code
		wantMsg  string
	}{
		{"a problem's title and detail", http.StatusConflict, problem, `{"title":"Settled as failed","detail":"Send it again under a new key."}`,
			codes.FailedPrecondition, "Settled as failed: Send it again under a new key."},
		{"a problem's title alone", http.StatusConflict, problem, `{"title":"Settled as failed"}`, codes.FailedPrecondition, "Settled as failed"},
		{"a problem's title, its detail empty", http.StatusConflict, problem, `{"title":"Settled as failed","detail":""}`, codes.FailedPrecondition, "Settled as failed"},
		{"a problem's detail alone", http.StatusConflict, problem, `{"detail":"Send it again under a new key."}`, codes.FailedPrecondition, "Send it again under a new key."},
		{"a problem with neither: its text", http.StatusConflict, problem, ` {"type":"about:blank"} `, codes.FailedPrecondition, `{"type":"about:blank"}`},
		{"JSON that does not parse: its text", http.StatusConflict, problem, `{"title":`, codes.FailedPrecondition, `{"title":`},
		{"a problem's JSON sent as text: its text", http.StatusConflict, text, `{"title":"Settled as failed"}`, codes.FailedPrecondition, `{"title":"Settled as failed"}`},
		{"an empty body: the status's text", http.StatusConflict, text, "", codes.FailedPrecondition, "Conflict"},
		{"blanks: the status's text", http.StatusNotFound, text, " \n\t", codes.NotFound, "Not Found"},
		{"a 400", http.StatusBadRequest, text, "the amount is negative", codes.InvalidArgument, "the amount is negative"},
		{"a 403", http.StatusForbidden, text, "not yours", codes.PermissionDenied, "not yours"},
		{"a 410", http.StatusGone, text, "", codes.NotFound, "Gone"},
		{"a 413", http.StatusRequestEntityTooLarge, text, "", codes.InvalidArgument, "Request Entity Too Large"},
		{"a 402, a 4xx with no code of its own", http.StatusPaymentRequired, text, "declined", codes.FailedPrecondition, "declined"},
		{"a 498, the last 4xx with no code of its own", 498, text, "x", codes.FailedPrecondition, "x"},
		{"1024 bytes of text, whole", http.StatusConflict, text, long, codes.FailedPrecondition, long},
		{"1025 bytes of text, cut at 1024", http.StatusConflict, text, long + "b", codes.FailedPrecondition, long},
		{"1024 bytes of text once trimmed, whole", http.StatusConflict, text, "\n" + long + "\n", codes.FailedPrecondition, long},
		{"a character the cut would split, left out", http.StatusConflict, text, long[:1023] + "é and more", codes.FailedPrecondition, long[:1023]},
		{"a byte not UTF-8 in a short text", http.StatusConflict, text, "bad \xff byte", codes.FailedPrecondition, "bad \uFFFD byte"},
		{"a byte not UTF-8 ending 1024 bytes: its U+FFFD is cut", http.StatusConflict, text, long[:1023] + "\xff", codes.FailedPrecondition, long[:1023]},
		{"a byte not UTF-8 in 1022 bytes: 1024 once read", http.StatusConflict, text, long[:1021] + "\xff", codes.FailedPrecondition, long[:1021] + "\uFFFD"},
		{"a byte not UTF-8 in a text that is cut", http.StatusConflict, text, "\xff" + long, codes.FailedPrecondition, "\uFFFD" + long[:1021]},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ic, err := idemgrpc.New(&idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Default: idemgrpc.Required})
			if err != nil {
				t.Fatal(err)
			}
			call := stoppedCalls(t, ic)
			if _, _, err := call("k"); status.Code(err) != codes.Unavailable {
				t.Fatalf("the first call: %v; want it stopped at its point, Unavailable", err)
			}
			comp, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: func(context.Context, idemgrpc.Execution) (any, error) { return nil, errors.New("not here") }})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := comp.Settle(t.Context(), "", "k", idem.Response{Status: c.status, Header: c.header, Body: []byte(c.body)}, false); err != nil {
				t.Fatalf("settling with %d: %v", c.status, err)
			}
			_, md, err := call("k")
			if st := status.Convert(err); st.Code() != c.wantCode || st.Message() != c.wantMsg || len(md.Get(idemgrpc.MetadataReplayed)) != 1 {
				t.Fatalf("the retry of a key settled with %d %q: %v %q, metadata %v;\nwant %v %q, replayed", c.status, c.body, st.Code(), st.Message(), md, c.wantCode, c.wantMsg)
			}
		})
	}
}

// A settled answer's headers reach the client as header metadata, named in
// lowercase, when metadata can carry their names (lowercase letters, digits,
// '-', '_' and '.'): each such name at the edges of its ranges arrives, and
// a name with any other character is left out, not sent (gRPC would refuse
// the whole header, and the client would get Internal, not the answer), as
// are Content-Type, Content-Length and gRPC's own grpc-… names.
func TestSettledAnswersHeadersAsTheClientReadsThem(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SharedScope: true, Default: idemgrpc.Required})
	if err != nil {
		t.Fatal(err)
	}
	call := stoppedCalls(t, ic)
	comp, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: func(context.Context, idemgrpc.Execution) (any, error) { return nil, errors.New("not here") }})
	if err != nil {
		t.Fatal(err)
	}
	// Each carried name holds one character at an edge of the ranges
	// metadata allows; each left out one character just past an edge.
	carried := map[string]string{"Idem-Settled-By-Operator": "idem-settled-by-operator", "X-A": "x-a", "x-z": "x-z", "x-0": "x-0", "x-9": "x-9",
		"x_u": "x_u", "x.d": "x.d", "a": "a", "z": "z", "0": "0", "9": "9", "_": "_", ".": "."}
	leftOut := []string{"x-`", "x-{", "x-/", "x-:", "x-^", "x-,", "x y", "x-é", "x-ÿ", "`", "{", "/", ":", "", "Content-Type", "Content-Length", "Grpc-Retry-Pushback-Ms"}
	for i, name := range []string{"x-a", "x-z", "x-0", "x-9", "x_u", "x.d"} {
		// One at a time as well: a name alone in its answer.
		key := idem.Key(fmt.Sprintf("carried-%d", i))
		if _, _, err := call(string(key)); status.Code(err) != codes.Unavailable {
			t.Fatalf("the first call of %s: %v", key, err)
		}
		if _, err := comp.Settle(t.Context(), "", key, idem.Response{Status: http.StatusConflict, Header: http.Header{name: {"v"}}, Body: []byte("settled")}, false); err != nil {
			t.Fatal(err)
		}
		if _, md, err := call(string(key)); status.Code(err) != codes.FailedPrecondition || !slices.Equal(md.Get(name), []string{"v"}) {
			t.Errorf("the retry of a key settled with the header %q alone: %v, metadata %v; want FailedPrecondition and %s: v", name, err, md, name)
		}
	}
	for i, name := range []string{"x-`", "x-{", "x-/", "x-:", "x-é"} {
		key := idem.Key(fmt.Sprintf("left-out-%d", i))
		if _, _, err := call(string(key)); status.Code(err) != codes.Unavailable {
			t.Fatalf("the first call of %s: %v", key, err)
		}
		if _, err := comp.Settle(t.Context(), "", key, idem.Response{Status: http.StatusConflict, Header: http.Header{name: {"v"}}, Body: []byte("settled")}, false); err != nil {
			t.Fatal(err)
		}
		if _, md, err := call(string(key)); status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "settled" || md.Get(name) != nil {
			t.Errorf("the retry of a key settled with the header %q alone: %v, metadata %v; want FailedPrecondition \"settled\", the header left out", name, err, md)
		}
	}

	h := http.Header{}
	carriedAs := map[string]bool{}
	for name, lower := range carried {
		h[name] = []string{"v-" + name}
		carriedAs[lower] = true
	}
	for _, name := range leftOut {
		h[name] = []string{"w"}
	}
	h["Content-Type"] = []string{"text/plain"}
	if _, _, err := call("all"); status.Code(err) != codes.Unavailable {
		t.Fatalf("the first call: %v", err)
	}
	if _, err := comp.Settle(t.Context(), "", "all", idem.Response{Status: http.StatusConflict, Header: h, Body: []byte("settled")}, false); err != nil {
		t.Fatal(err)
	}
	_, md, err := call("all")
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "settled" {
		t.Fatalf("the retry of a key settled with many headers: %v; want FailedPrecondition \"settled\"", err)
	}
	for name, lower := range carried {
		if got := md.Get(lower); !slices.Equal(got, []string{"v-" + name}) {
			t.Errorf("header %q: metadata %s = %q; want [v-%s]", name, lower, got, name)
		}
	}
	for name, vals := range md {
		if name == idemgrpc.MetadataReplayed || name == "content-type" && slices.Equal(vals, []string{"application/grpc"}) {
			continue
		}
		if !slices.Contains(leftOut, name) && !carriedAs[name] {
			t.Errorf("metadata %s = %q, from no header of the answer", name, vals)
		}
		if slices.Contains(vals, "w") {
			t.Errorf("metadata %s = %q: a header that should have been left out", name, vals)
		}
	}
}

// DefaultSettle refuses a 2xx, and only a 2xx (its message is the method's,
// which only the application can make); every other status becomes a
// status error of SettleCode's code.
func TestDefaultSettleRefusesEvery2xxAndOnlyThem(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status int
		code   codes.Code // when not refused
	}{{199, codes.Internal}, {200, codes.OK}, {204, codes.OK}, {299, codes.OK}, {300, codes.Internal}, {304, codes.Internal}, {409, codes.FailedPrecondition}} {
		resp, err := idemgrpc.DefaultSettle(idem.Response{Status: c.status, Body: []byte("x")})
		refused := errors.Is(err, idemgrpc.ErrSettleNeedsMessage)
		if want := c.status >= 200 && c.status <= 299; refused != want || resp != nil {
			t.Errorf("DefaultSettle(%d) = %v, %v; want refused %t", c.status, resp, err, want)
			continue
		}
		if !refused && (status.Code(err) != c.code || status.Convert(err).Message() != "x") {
			t.Errorf("DefaultSettle(%d) = %v; want %v \"x\"", c.status, err, c.code)
		}
	}
}
