package acquirer

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Component is the name under which the acquirer's tables are migrated.
const Component = "acquirer"

// DeclinedPrefix starts the references of the cards the acquirer always
// declines (402, card-declined): the test cards for a refusal, which is
// deterministic and kept with its key like any other answer.
const DeclinedPrefix = "declined_"

// MaxAmount bounds a charge, in minor units.
const MaxAmount = 1_000_000_000_000

// Config configures a Server.
type Config struct {
	// DB keeps the charges, the refunds and the idempotency keys of the
	// requests that made them, in one transaction each. Required. The
	// Server does not close it.
	DB *idemsqlite.DB
	// APIKey, when set, is the bearer key every request must carry
	// (Authorization: Bearer APIKey). Defaults to none: the network is
	// open to anyone who reaches it.
	APIKey string
	// Faults makes the acquirer honour the Idem-Fault request header
	// (see HeaderFault) and FaultRate. Never in production.
	Faults bool
	// FaultRate is the share of charges and refunds, from 0 to 1, that
	// meet a random fault when Faults is on: half of them are refused
	// with 503 before anything happens, half are made and their answer is
	// dropped (the connection closes without one). Defaults to 0.
	FaultRate float64
	// Rand draws the random faults: a number in [0, 1). Defaults to a
	// random source; tests inject a sequence.
	Rand func() float64
	// KeyTTL is how long an idempotency key is remembered: a retry within
	// it gets the first answer. Defaults to 24h.
	KeyTTL time.Duration
	// Clock stamps charges and refunds and decides key expiry. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
	// Logger receives the faults injected. Defaults to discarding.
	Logger *slog.Logger
}

// Server is the card network: its HTTP API over its database.
type Server struct {
	db        *idemsqlite.DB
	apiKey    [sha256.Size]byte
	hasKey    bool
	faults    bool
	faultRate float64
	randMu    sync.Mutex
	rand      func() float64
	clock     idem.Clock
	logger    *slog.Logger
	keys      *idemhttp.Middleware
}

// New migrates the acquirer's tables in cfg.DB and returns a Server on it.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DB == nil {
		return nil, errors.New("acquirer: Config.DB is required")
	}
	if cfg.FaultRate < 0 || cfg.FaultRate > 1 {
		return nil, fmt.Errorf("acquirer: the fault rate %v is not between 0 and 1", cfg.FaultRate)
	}
	if cfg.Clock == nil {
		cfg.Clock = idem.SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rand == nil {
		cfg.Rand = mrand.Float64
	}
	if cfg.KeyTTL == 0 {
		cfg.KeyTTL = 24 * time.Hour
	}
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	if err := cfg.DB.Migrate(ctx, Component, sub); err != nil {
		return nil, fmt.Errorf("acquirer: %w", err)
	}
	store, err := idemsqlite.NewStore(ctx, cfg.DB, &idemsqlite.StoreConfig{Clock: cfg.Clock})
	if err != nil {
		return nil, fmt.Errorf("acquirer: %w", err)
	}
	keys, err := idemhttp.New(&idemhttp.Config{
		Store: store,
		// One merchant per network here: its API key, when there is
		// one, already decides who may call at all.
		SharedScope: true,
		TTL:         cfg.KeyTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("acquirer: %w", err)
	}
	s := &Server{db: cfg.DB, faults: cfg.Faults, faultRate: cfg.FaultRate, rand: cfg.Rand,
		clock: cfg.Clock, logger: cfg.Logger, keys: keys}
	if cfg.APIKey != "" {
		s.apiKey, s.hasKey = sha256.Sum256([]byte(cfg.APIKey)), true
	}
	return s, nil
}

// Handler returns the acquirer's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", s.writes(http.HandlerFunc(s.createCharge)))
	mux.Handle("POST /v1/charges/{id}/refunds", s.writes(http.HandlerFunc(s.createRefund)))
	mux.HandleFunc("GET /v1/charges/{id}", s.getCharge)
	mux.HandleFunc("GET /v1/charges", s.listCharges)
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "not-found", "no such resource or method: "+r.Method+" "+r.URL.Path)
	})
	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	root.Handle("/v1/", s.authenticate(mux))
	return root
}

// writes puts a charge or refund behind the idempotency middleware and,
// outside it, the faults.
func (s *Server) writes(h http.Handler) http.Handler {
	h = s.keys.Handler(h)
	if s.faults {
		h = s.injectFaults(h)
	}
	return h
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	if !s.hasKey {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(sum[:], s.apiKey[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="acquirer"`)
			writeProblem(w, http.StatusUnauthorized, "unauthorized", "send the acquirer's API key as 'Authorization: Bearer <key>'")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Charge is money taken from a card at the network.
type Charge struct {
	ID          string            `json:"id"`
	Amount      int64             `json:"amount"`
	Currency    string            `json:"currency"`
	Reference   string            `json:"reference"`
	Description string            `json:"description,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	// IdempotencyKey is the key of the request that made the charge: the
	// number of charges under one logical payment's key is what a
	// reconciliation counts.
	IdempotencyKey string    `json:"idempotency_key"`
	AmountRefunded int64     `json:"amount_refunded"`
	CreatedAt      time.Time `json:"created_at"`
}

// ChargeRequest is the body of POST /v1/charges.
type ChargeRequest struct {
	Amount      int64             `json:"amount"`
	Currency    string            `json:"currency"`
	Reference   string            `json:"reference"`
	Description string            `json:"description,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

// Refund is money given back on a charge.
type Refund struct {
	ID             string    `json:"id"`
	ChargeID       string    `json:"charge_id"`
	Amount         int64     `json:"amount"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
}

func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	var req ChargeRequest
	if !decode(w, r, &req) {
		return
	}
	if msg := req.invalid(); msg != "" {
		writeProblem(w, http.StatusBadRequest, "invalid-request", msg)
		return
	}
	if strings.HasPrefix(req.Reference, DeclinedPrefix) {
		writeProblem(w, http.StatusPaymentRequired, "card-declined", "the card "+req.Reference+" was declined")
		return
	}
	if err := sleepFault(r); err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	meta, err := json.Marshal(req.Metadata)
	if err != nil || req.Metadata == nil {
		meta = []byte("{}")
	}
	c := Charge{ID: "ch_" + strings.ToLower(rand.Text()), Amount: req.Amount, Currency: req.Currency,
		Reference: req.Reference, Description: req.Description, Metadata: req.Metadata,
		IdempotencyKey: r.Header.Get(idemhttp.HeaderKey), CreatedAt: s.clock.Now().UTC()}
	err = s.db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO acq_charges (id, amount, currency, reference, description, metadata, idempotency_key, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, c.ID, c.Amount, c.Currency, c.Reference, c.Description, string(meta),
			c.IdempotencyKey, c.CreatedAt.Format(time.RFC3339Nano))
		if err != nil {
			return err
		}
		return failBeforeCommit(r)
	})
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "the charge was not made: "+err.Error())
		return
	}
	w.Header().Set("Location", "/v1/charges/"+c.ID)
	writeJSON(w, http.StatusCreated, c)
}

func (req ChargeRequest) invalid() string {
	switch {
	case req.Amount <= 0 || req.Amount > MaxAmount:
		return fmt.Sprintf("amount must be a positive number of minor units, at most %d", int64(MaxAmount))
	case !currency(req.Currency):
		return "currency must be three upper-case letters (ISO 4217)"
	case req.Reference == "" || len(req.Reference) > 200:
		return "reference (the card or account charged) is required, at most 200 bytes"
	case len(req.Description) > 1000:
		return "description must be at most 1000 bytes"
	case len(req.Metadata) > 20:
		return "metadata holds at most 20 entries"
	}
	return ""
}

func currency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for _, r := range c {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}

func (s *Server) createRefund(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount *int64 `json:"amount"`
	}
	if !decode(w, r, &req) {
		return
	}
	if err := sleepFault(r); err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	rf := Refund{ID: "re_" + strings.ToLower(rand.Text()), ChargeID: r.PathValue("id"),
		IdempotencyKey: r.Header.Get(idemhttp.HeaderKey), CreatedAt: s.clock.Now().UTC()}
	var refusal string
	err := s.db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
		var amount, refunded int64
		err := tx.QueryRowContext(ctx, `SELECT amount, amount_refunded FROM acq_charges WHERE id = ?`, rf.ChargeID).Scan(&amount, &refunded)
		if errors.Is(err, sql.ErrNoRows) {
			refusal = "no charge " + rf.ChargeID
			return nil
		}
		if err != nil {
			return err
		}
		rf.Amount = amount - refunded
		if req.Amount != nil {
			rf.Amount = *req.Amount
		}
		if rf.Amount <= 0 || rf.Amount > amount-refunded {
			refusal = fmt.Sprintf("the refund must be positive and at most the %d not yet refunded", amount-refunded)
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE acq_charges SET amount_refunded = amount_refunded + ? WHERE id = ?`, rf.Amount, rf.ChargeID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO acq_refunds (id, charge_id, amount, idempotency_key, created_at) VALUES (?, ?, ?, ?, ?)`,
			rf.ID, rf.ChargeID, rf.Amount, rf.IdempotencyKey, rf.CreatedAt.Format(time.RFC3339Nano)); err != nil {
			return err
		}
		return failBeforeCommit(r)
	})
	switch {
	case err != nil:
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", "the refund was not made: "+err.Error())
	case refusal != "":
		writeProblem(w, http.StatusUnprocessableEntity, "refund-refused", refusal)
	default:
		writeJSON(w, http.StatusCreated, rf)
	}
}

const chargeColumns = `seq, id, amount, currency, reference, description, metadata, idempotency_key, amount_refunded, created_at`

func scanCharge(scan func(...any) error) (Charge, int64, error) {
	var (
		c       Charge
		seq     int64
		meta    string
		created string
	)
	if err := scan(&seq, &c.ID, &c.Amount, &c.Currency, &c.Reference, &c.Description, &meta, &c.IdempotencyKey, &c.AmountRefunded, &created); err != nil {
		return Charge{}, 0, err
	}
	if err := json.Unmarshal([]byte(meta), &c.Metadata); err != nil {
		return Charge{}, 0, fmt.Errorf("charge %s: metadata: %w", c.ID, err)
	}
	if len(c.Metadata) == 0 {
		c.Metadata = nil
	}
	t, err := time.Parse(time.RFC3339Nano, created)
	if err != nil {
		return Charge{}, 0, fmt.Errorf("charge %s: created_at: %w", c.ID, err)
	}
	c.CreatedAt = t
	return c, seq, nil
}

func (s *Server) getCharge(w http.ResponseWriter, r *http.Request) {
	c, _, err := scanCharge(s.db.Reader().QueryRowContext(r.Context(),
		`SELECT `+chargeColumns+` FROM acq_charges WHERE id = ?`, r.PathValue("id")).Scan)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		writeProblem(w, http.StatusNotFound, "not-found", "no charge "+r.PathValue("id"))
	case err != nil:
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
	default:
		writeJSON(w, http.StatusOK, c)
	}
}

// ChargeList is a page of GET /v1/charges.
type ChargeList struct {
	Data    []Charge `json:"data"`
	HasMore bool     `json:"has_more"`
}

// DefaultListLimit and MaxListLimit bound a page of charges.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// listCharges lists charges in the order they were made, all of them or a
// reference's (?reference=), those made at or after a time
// (?created_gte=, RFC 3339), a page at a time (?limit=, and
// ?starting_after= the last charge of the previous page).
func (s *Server) listCharges(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxListLimit {
			writeProblem(w, http.StatusBadRequest, "invalid-request", fmt.Sprintf("limit must be a number from 1 to %d", MaxListLimit))
			return
		}
		limit = n
	}
	var createdGTE time.Time
	if v := q.Get("created_gte"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "invalid-request", "created_gte must be an RFC 3339 time, such as 2026-12-01T00:00:00Z")
			return
		}
		createdGTE = t
	}
	after := int64(0)
	if id := q.Get("starting_after"); id != "" {
		err := s.db.Reader().QueryRowContext(r.Context(), `SELECT seq FROM acq_charges WHERE id = ?`, id).Scan(&after)
		if errors.Is(err, sql.ErrNoRows) {
			writeProblem(w, http.StatusBadRequest, "invalid-request", "starting_after names no charge: "+id)
			return
		}
		if err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
			return
		}
	}
	query := `SELECT ` + chargeColumns + ` FROM acq_charges WHERE seq > ? ORDER BY seq`
	args := []any{after}
	if ref := q.Get("reference"); ref != "" {
		query = `SELECT ` + chargeColumns + ` FROM acq_charges WHERE reference = ? AND seq > ? ORDER BY seq`
		args = append([]any{ref}, args...)
	}
	if createdGTE.IsZero() {
		query += ` LIMIT ?`
		args = append(args, limit+1)
	}
	// created_at is stored as RFC 3339 text, whose order is not time's
	// (fractions of a second are trimmed), so the time filter is applied
	// here, reading on until the page is full.
	rows, err := s.db.Reader().QueryContext(r.Context(), query, args...)
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	defer rows.Close()
	list := ChargeList{Data: []Charge{}}
	for rows.Next() {
		c, _, err := scanCharge(rows.Scan)
		if err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
			return
		}
		if c.CreatedAt.Before(createdGTE) {
			continue
		}
		list.Data = append(list.Data, c)
		if len(list.Data) > limit {
			break
		}
	}
	if err := rows.Err(); err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	if len(list.Data) > limit {
		list.Data, list.HasMore = list.Data[:limit], true
	}
	writeJSON(w, http.StatusOK, list)
}

// maxBody bounds a request body.
const maxBody = 64 << 10

func decode(w http.ResponseWriter, r *http.Request, dst any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "the body is not the JSON object expected: "+err.Error())
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// ProblemTypePrefix starts the type of every problem the acquirer answers.
const ProblemTypePrefix = "urn:idem:acquirer:"

func writeProblem(w http.ResponseWriter, status int, slug, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{
		"type": ProblemTypePrefix + slug, "title": http.StatusText(status), "status": status, "detail": detail,
	})
}
