package payments

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

func TestParseFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    faults
		wantErr string
	}{
		{in: "", want: faults{}},
		{in: "delay=300ms", want: faults{delay: 300 * time.Millisecond}},
		{in: "delay=300ms,drop-after-commit", want: faults{delay: 300 * time.Millisecond, dropAfterCommit: true}},
		{in: " fail-before-commit , delay = 1s ", want: faults{delay: time.Second, failBeforeCommit: true}},
		{in: "drop-after-commit,,", want: faults{dropAfterCommit: true}},
		{in: "crash-after-commit, delay=5ms", want: faults{delay: 5 * time.Millisecond, crashAfterCommit: true}},
		{in: "crash-after-commit=now", wantErr: "unknown fault"},
		{in: "delay=0s", want: faults{}},
		{in: "explode", wantErr: `unknown fault "explode"`},
		{in: "delay", wantErr: `unknown fault "delay"`},
		{in: "fail-before-commit=1", wantErr: "unknown fault"},
		{in: "delay=soon", wantErr: "invalid duration"},
		{in: "delay=-1s", wantErr: "between 0 and"},
		{in: "delay=2m", wantErr: "between 0 and"},
	}
	for _, tt := range tests {
		got, err := parseFaults(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseFaults(%q) error = %v, want it to contain %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseFaults(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestInjectDelayHonoursContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(withFaults(context.Background(), faults{delay: time.Minute}))
	cancel()
	err := injectDelay(ctx)
	if !errors.Is(err, ErrTransient) || !errors.Is(err, context.Canceled) {
		t.Fatalf("injectDelay on a cancelled context = %v", err)
	}
	if err := injectDelay(context.Background()); err != nil {
		t.Fatalf("injectDelay without faults = %v", err)
	}
	if err := injectBeforeCommit(withFaults(context.Background(), faults{failBeforeCommit: true})); !errors.Is(err, ErrTransient) {
		t.Fatalf("injectBeforeCommit = %v, want ErrTransient", err)
	}
}

func TestValidateCurrency(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"KRW", "USD", "EUR", "XXX"} {
		if err := validateCurrency("currency", c); err != nil {
			t.Errorf("validateCurrency(%q) = %v", c, err)
		}
	}
	for _, c := range []string{"", "krw", "KR", "KRWW", "K1W", "ÄBC", "US "} {
		err := validateCurrency("currency", c)
		if !errors.Is(err, ErrInvalidCurrency) || !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("validateCurrency(%q) = %v, want ErrInvalidCurrency and ErrInvalidRequest", c, err)
		}
	}
}

func TestValidateAmountAndDescription(t *testing.T) {
	t.Parallel()
	tests := []struct {
		amount int64
		ok     bool
	}{{1, true}, {1 << 62, true}, {0, false}, {-1, false}}
	for _, tt := range tests {
		err := validateAmount("amount", tt.amount)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidAmount)) {
			t.Errorf("validateAmount(%d) = %v", tt.amount, err)
		}
	}
	for d, ok := range map[string]bool{
		"":                                       true,
		"coffee ☕":                               true,
		strings.Repeat("x", MaxDescriptionLen):   true,
		strings.Repeat("x", MaxDescriptionLen+1): false,
		"line\nbreak":                            false,
		"bad \uFFFD":                             false,
	} {
		if err := validateDescription(d); (err == nil) != ok {
			t.Errorf("validateDescription(%.20q) = %v, want ok=%v", d, err, ok)
		}
	}
}

func TestNewID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := newID("pay_")
		if !strings.HasPrefix(id, "pay_") || len(id) != len("pay_")+26 || strings.ToLower(id) != id {
			t.Fatalf("newID = %q", id)
		}
		if seen[id] {
			t.Fatalf("newID repeated %q", id)
		}
		seen[id] = true
	}
}

func TestParseAPIKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{in: "acme:sk_1", want: map[string]string{"sk_1": "acme"}},
		{in: " acme : sk_1 , globex:sk_2,acme:sk_3 ", want: map[string]string{"sk_1": "acme", "sk_2": "globex", "sk_3": "acme"}},
		{in: "acme:sk:with:colons", want: map[string]string{"sk:with:colons": "acme"}},
		{in: "", wantErr: "no API keys"},
		{in: " , ", wantErr: "no API keys"},
		{in: "acme", wantErr: "want tenant:key"},
		{in: ":sk_1", wantErr: "tenant is empty"},
		{in: "acme:", wantErr: "is empty"},
		{in: "acme:sk 1", wantErr: "white space"},
		{in: "acme:sk_1,globex:sk_1", wantErr: "same API key"},
	}
	for _, tt := range tests {
		got, err := ParseAPIKeys(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseAPIKeys(%q) error = %v, want it to contain %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseAPIKeys(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	if _, err := ParseAPIKeys("acme:sk_secret_value,broken"); err == nil || strings.Contains(err.Error(), "sk_secret_value") {
		t.Errorf("an error must not echo keys: %v", err)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  *Config
		want string
	}{
		{"nil", nil, "a database is required: set DB (SQLite) or Postgres"},
		{"both databases", &Config{DB: &idemsqlite.DB{}, Postgres: &idempg.DB{}}, "set exactly one"},
		{"negative lease", &Config{KeyLease: -time.Second}, "KeyLease must not be negative"},
		{"lease beyond TTL", &Config{KeyLease: time.Hour, KeyTTL: time.Minute}, "KeyLease (1h0m0s) must not be longer than KeyTTL (1m0s)"},
		{"no keys", &Config{}, "APIKeys must hold at least one key"},
		{"empty tenant", &Config{APIKeys: map[string]string{"k": ""}}, "empty tenant"},
		{"negative TTL", &Config{KeyTTL: -time.Second}, "KeyTTL must not be negative"},
		{"negative wait", &Config{InflightWait: -time.Second}, "InflightWait must not be negative"},
	}
	for _, tt := range tests {
		_, err := New(context.Background(), tt.cfg)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: New error = %v, want ErrConfig mentioning %q", tt.name, err, tt.want)
		}
	}
}

func TestPGErrorClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		err       error
		transient bool
	}{
		{"serialization failure", &pgconn.PgError{Code: "40001"}, true},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"check violation", &pgconn.PgError{Code: "23514"}, false},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, false},
		{"no rows", pgx.ErrNoRows, false},
		{"conn closed", fmt.Errorf("query: %w", pgconn.ErrConnClosed), true},
		{"socket reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"truncated answer", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true},
		{"deadline", context.DeadlineExceeded, true},
		{"a bug", errors.New("cannot scan text into *int64"), false},
	}
	for _, tt := range tests {
		err := pgErr("op", tt.err)
		if got := errors.Is(err, ErrTransient); got != tt.transient {
			t.Errorf("%s: pgErr(%v) transient = %v, want %v", tt.name, tt.err, got, tt.transient)
		}
		if !errors.Is(err, tt.err) || !strings.HasPrefix(err.Error(), "op: ") {
			t.Errorf("%s: pgErr(%v) = %v; want it to wrap the error under the operation's name", tt.name, tt.err, err)
		}
	}
}
