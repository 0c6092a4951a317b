package payments

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemhttp"
)

// MaxBodyBytes is the largest request body accepted; larger ones get 413.
const MaxBodyBytes = 1 << 20

// ProblemTypePrefix starts every problem type URI this service answers
// with; the slug after it is stable, for clients to branch on.
const ProblemTypePrefix = "urn:idem:problem:"

// HeaderMode is set to "unsafe" on every response in unsafe mode, so no one
// mistakes a double-charging server for a protected one.
const HeaderMode = "Idem-Mode"

const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// routes builds the whole HTTP surface. The order of the wrappers around a
// protected write matters: authentication first (the idempotency scope is
// the tenant), then the fault header (refused before a key is claimed),
// then drop-after-commit and crash-after-commit (outside the middleware, so
// they act on an answer that was already committed), then the idempotency
// middleware, then the handler.
func (s *Service) routes() http.Handler {
	v1 := http.NewServeMux()
	v1.Handle("POST /v1/accounts", s.protect(s.accountsMW, http.HandlerFunc(s.createAccount)))
	v1.HandleFunc("GET /v1/accounts/{id}", s.getAccount)
	v1.Handle("POST /v1/accounts/{id}/deposits", s.protect(s.depositsMW, http.HandlerFunc(s.createDeposit)))
	v1.HandleFunc("GET /v1/accounts/{id}/deposits", s.listDeposits)
	v1.HandleFunc("GET /v1/accounts/{id}/payments", s.listPayments)
	v1.Handle("POST /v1/payments", s.wakeRelay(s.protect(s.paymentsMW, http.HandlerFunc(s.createPayment))))
	v1.HandleFunc("GET /v1/payments/{id}", s.getPayment)
	v1.Handle("POST /v1/refunds", s.wakeRelay(s.protect(s.refundsMW, http.HandlerFunc(s.createRefund))))
	v1.HandleFunc("GET /v1/refunds/{id}", s.getRefund)
	v1.HandleFunc("GET /v1/settlement", s.getSettlement)
	// Method-less patterns are less specific than the ones above, so they
	// only catch the wrong methods, which then get a problem+json 405.
	v1.Handle("/v1/accounts", methodNotAllowed(http.MethodPost))
	v1.Handle("/v1/accounts/{id}", methodNotAllowed(http.MethodGet, http.MethodHead))
	v1.Handle("/v1/accounts/{id}/deposits", methodNotAllowed(http.MethodPost, http.MethodGet, http.MethodHead))
	v1.Handle("/v1/accounts/{id}/payments", methodNotAllowed(http.MethodGet, http.MethodHead))
	v1.Handle("/v1/payments", methodNotAllowed(http.MethodPost))
	v1.Handle("/v1/payments/{id}", methodNotAllowed(http.MethodGet, http.MethodHead))
	v1.Handle("/v1/refunds", methodNotAllowed(http.MethodPost))
	v1.Handle("/v1/refunds/{id}", methodNotAllowed(http.MethodGet, http.MethodHead))
	v1.Handle("/v1/settlement", methodNotAllowed(http.MethodGet, http.MethodHead))
	v1.HandleFunc("/v1/", notFound)

	var api http.Handler = v1
	if s.faults {
		api = s.faultParser(s.afterCommit(api))
	}
	api = s.authenticate(api)
	if s.requestTimeout > 0 {
		api = withRequestTimeout(api, s.requestTimeout)
	}

	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", s.healthz)
	root.HandleFunc("GET /readyz", s.readyz)
	root.Handle("GET /openapi.json", s.openAPIHandler())
	root.Handle("GET /metrics", s.metrics)
	root.Handle("/v1/", api)
	root.HandleFunc("/", notFound)
	if !s.unsafe {
		return root
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderMode, "unsafe")
		root.ServeHTTP(w, r)
	})
}

// protect puts a write behind its idempotency middleware; in unsafe mode
// there is none, and the Idempotency-Key header is ignored.
func (s *Service) protect(mw *idemhttp.Middleware, h http.Handler) http.Handler {
	if mw == nil {
		return h
	}
	return mw.Handler(h)
}

// --- authentication ---

type tenantKey struct{}

// apiKey keeps the SHA-256 of a key rather than the key, so every
// comparison is of equal-length values and takes the same time.
type apiKey struct {
	sum    [sha256.Size]byte
	tenant string
}

func (s *Service) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
			writeProblem(w, http.StatusUnauthorized, "unauthorized", "Unauthorized",
				"send an API key as 'Authorization: Bearer <key>'", nil)
			return
		}
		tenant := s.tenantOf(token)
		if tenant == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments", error="invalid_token"`)
			writeProblem(w, http.StatusUnauthorized, "unauthorized", "Unauthorized", "the API key is not valid", nil)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

func tenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// --- handlers ---

func (s *Service) createAccount(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Balance  int64   `json:"balance"`
		Currency *string `json:"currency"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	var err error
	switch {
	case req.Currency == nil:
		err = &FieldError{Field: "currency", Reason: "is required", Err: ErrInvalidCurrency}
	case req.Balance < 0:
		err = &FieldError{Field: "balance", Reason: fmt.Sprintf("must not be negative, got %d", req.Balance), Err: ErrInvalidAmount}
	default:
		err = validateCurrency("currency", *req.Currency)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := injectDelay(r.Context()); err != nil {
		s.fail(w, r, err)
		return
	}
	a := Account{
		ID:        newID("acct_"),
		Tenant:    tenantFrom(r.Context()),
		Balance:   req.Balance,
		Currency:  *req.Currency,
		CreatedAt: s.now(),
	}
	if err := s.store.CreateAccount(r.Context(), a); err != nil {
		s.failWrite(w, r, originFrom(r.Context()), err)
		return
	}
	s.crashAfterOwnCommit(r)
	w.Header().Set("Location", "/v1/accounts/"+a.ID)
	writeJSON(w, http.StatusCreated, a)
}

func (s *Service) getAccount(w http.ResponseWriter, r *http.Request) {
	a, err := s.store.Account(r.Context(), tenantFrom(r.Context()), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func (s *Service) createDeposit(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount *int64 `json:"amount"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	if req.Amount == nil {
		s.fail(w, r, &FieldError{Field: "amount", Reason: "is required", Err: ErrInvalidAmount})
		return
	}
	if err := validateAmount("amount", *req.Amount); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := injectDelay(r.Context()); err != nil {
		s.fail(w, r, err)
		return
	}
	d := Deposit{
		ID:        newID("dep_"),
		Tenant:    tenantFrom(r.Context()),
		AccountID: r.PathValue("id"),
		Amount:    *req.Amount,
		CreatedAt: s.now(),
	}
	o := s.originOf(r)
	rec, err := s.store.CreateDeposit(r.Context(), d, o)
	if err != nil {
		s.failWrite(w, r, o, err)
		return
	}
	if rec.ID != d.ID {
		s.logger.WarnContext(r.Context(), "payments: an earlier execution of this idempotency key made the deposit; answering with it, crediting nothing",
			"deposit", rec.ID)
	}
	s.crashAfterOwnCommit(r)
	writeJSON(w, http.StatusCreated, rec)
}

func (s *Service) createPayment(w http.ResponseWriter, r *http.Request) {
	var req struct {
		AccountID   *string `json:"account_id"`
		Amount      *int64  `json:"amount"`
		Currency    *string `json:"currency"`
		Description string  `json:"description"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	var err error
	switch {
	case req.AccountID == nil || *req.AccountID == "":
		err = &FieldError{Field: "account_id", Reason: "is required"}
	case req.Amount == nil:
		err = &FieldError{Field: "amount", Reason: "is required", Err: ErrInvalidAmount}
	case req.Currency == nil:
		err = &FieldError{Field: "currency", Reason: "is required", Err: ErrInvalidCurrency}
	default:
		err = errors.Join(
			validateAmount("amount", *req.Amount),
			validateCurrency("currency", *req.Currency),
			validateDescription(req.Description))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := injectDelay(r.Context()); err != nil {
		s.fail(w, r, err)
		return
	}
	p := Payment{
		ID:          newID("pay_"),
		Tenant:      tenantFrom(r.Context()),
		AccountID:   *req.AccountID,
		Amount:      *req.Amount,
		Currency:    *req.Currency,
		Description: req.Description,
		Status:      StatusSucceeded,
		CreatedAt:   s.now(),
	}
	if s.acquirer != nil {
		clientKey := r.Header.Get(idemhttp.HeaderKey)
		if p, clientKey, err = s.startCharging(r.Context(), p, clientKey); err != nil {
			s.fail(w, r, err)
			return
		}
		s.chargeAndRecord(w, r, p, clientKey)
		return
	}
	s.record(w, r, p, acquirer.Charge{})
}

// chargeAndRecord charges the payment at the card network, records it and
// answers: phase 2 of a payment in phases (see pointCharging), all of a
// payment otherwise. clientKey is the client's Idempotency-Key, which the
// charge carries for reconciliation.
func (s *Service) chargeAndRecord(w http.ResponseWriter, r *http.Request, p Payment, clientKey string) {
	charge, err := s.charge(r.Context(), r, p, clientKey)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p.ChargeID = charge.ID
	s.record(w, r, p, charge)
}

// record records the payment (paid for by charge, when the service charges
// cards) and answers.
func (s *Service) record(w http.ResponseWriter, r *http.Request, p Payment, charge acquirer.Charge) {
	o := s.originOf(r)
	rec, err := s.store.CreatePayment(r.Context(), p, o)
	if err != nil && s.acquirer != nil && !errors.Is(err, ErrTransient) && !errors.Is(err, errOutcomeUnknown) {
		// Refused after the card was charged (the account changed since
		// the check): the charge goes back before the refusal is answered.
		if rerr := s.refundCharge(r.Context(), charge); rerr != nil {
			err = rerr
		}
	}
	if err != nil {
		s.failWrite(w, r, o, err)
		return
	}
	if rec.ID != p.ID {
		// The key was taken over after an execution that committed the
		// payment but never completed the key (a crash, a lost lease).
		s.logger.WarnContext(r.Context(), "payments: an earlier execution of this idempotency key made the payment; answering with it, charging nothing",
			"payment", rec.ID)
	}
	s.crashAfterOwnCommit(r)
	w.Header().Set("Location", "/v1/payments/"+rec.ID)
	writeJSON(w, http.StatusCreated, rec)
}

func (s *Service) getPayment(w http.ResponseWriter, r *http.Request) {
	p, err := s.store.Payment(r.Context(), tenantFrom(r.Context()), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (s *Service) listPayments(w http.ResponseWriter, r *http.Request) {
	pg, err := parseListPage(r, "pay_")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, more, err := s.store.AccountPayments(r.Context(), tenantFrom(r.Context()), r.PathValue("id"), pg)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, paymentList{list, more})
}

func (s *Service) listDeposits(w http.ResponseWriter, r *http.Request) {
	pg, err := parseListPage(r, "dep_")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, more, err := s.store.AccountDeposits(r.Context(), tenantFrom(r.Context()), r.PathValue("id"), pg)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, depositList{list, more})
}

// maxIDLen bounds the IDs accepted as cursors: newID's are far shorter.
const maxIDLen = 64

// parseListPage reads a list's limit, starting_after and ending_before, as
// Stripe's lists take them. A cursor must look like an ID of the listed
// kind (prefix); whether it names an item of the list is the storage's to
// say. Each parameter may be given once, and the cursors are exclusive.
func parseListPage(r *http.Request, prefix string) (listPage, error) {
	q := r.URL.Query()
	for _, name := range []string{"limit", "starting_after", "ending_before"} {
		if len(q[name]) > 1 {
			return listPage{}, &FieldError{Field: name, Reason: "must be given at most once"}
		}
	}
	pg := listPage{limit: defaultListLimit}
	if v, ok := q["limit"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > maxListLimit {
			return listPage{}, &FieldError{Field: "limit", Reason: fmt.Sprintf("must be an integer from 1 to %d, got %q", maxListLimit, v[0])}
		}
		pg.limit = n
	}
	for _, c := range []struct {
		name string
		dst  *string
	}{{"starting_after", &pg.startingAfter}, {"ending_before", &pg.endingBefore}} {
		v, ok := q[c.name]
		if !ok {
			continue
		}
		if !wellFormedID(v[0], prefix) {
			return listPage{}, &FieldError{Field: c.name, Reason: fmt.Sprintf("must be an ID starting with %q", prefix), Err: ErrInvalidCursor}
		}
		*c.dst = v[0]
	}
	if pg.startingAfter != "" && pg.endingBefore != "" {
		return listPage{}, &FieldError{Field: "ending_before", Reason: "cannot be combined with starting_after", Err: ErrInvalidCursor}
	}
	return pg, nil
}

// wellFormedID reports whether id is prefix followed by lower-case letters
// and digits, as newID makes them.
func wellFormedID(id, prefix string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || rest == "" || len(id) > maxIDLen {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

func (s *Service) createRefund(w http.ResponseWriter, r *http.Request) {
	var req struct {
		PaymentID *string `json:"payment_id"`
		Amount    *int64  `json:"amount"`
		Reason    string  `json:"reason"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	var err error
	switch {
	case req.PaymentID == nil || *req.PaymentID == "":
		err = &FieldError{Field: "payment_id", Reason: "is required"}
	case req.Amount != nil:
		err = errors.Join(validateAmount("amount", *req.Amount), validateReason(req.Reason))
	default:
		err = validateReason(req.Reason)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := injectDelay(r.Context()); err != nil {
		s.fail(w, r, err)
		return
	}
	rf := Refund{
		ID:        newID("re_"),
		Tenant:    tenantFrom(r.Context()),
		PaymentID: *req.PaymentID,
		Reason:    req.Reason,
		Status:    StatusSucceeded,
		CreatedAt: s.now(),
	}
	if req.Amount != nil {
		rf.Amount = *req.Amount
	}
	o := s.originOf(r)
	rec, err := s.store.CreateRefund(r.Context(), rf, o)
	if err != nil {
		s.failWrite(w, r, o, err)
		return
	}
	if rec.ID != rf.ID {
		s.logger.WarnContext(r.Context(), "payments: an earlier execution of this idempotency key made the refund; answering with it, crediting nothing",
			"refund", rec.ID)
	}
	s.crashAfterOwnCommit(r)
	w.Header().Set("Location", "/v1/refunds/"+rec.ID)
	writeJSON(w, http.StatusCreated, rec)
}

func (s *Service) getRefund(w http.ResponseWriter, r *http.Request) {
	rf, err := s.store.Refund(r.Context(), tenantFrom(r.Context()), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rf)
}

func notFound(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, http.StatusNotFound, "not-found", "Not found", "no route for "+r.URL.Path, nil)
}

func methodNotAllowed(allowed ...string) http.Handler {
	allow := strings.Join(allowed, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
			fmt.Sprintf("%s is not allowed here; use %s", r.Method, allow), nil)
	})
}

// --- encoding ---

// decode reads exactly one JSON value into dst, strictly (decodeStrict):
// member names must be the API's, case for case, and given once; unknown
// fields, bodies over MaxBodyBytes and bodies that cannot be read are
// refused. On failure it has answered and returns false.
//
// The refusal is a 400, which the service does not keep under the
// Idempotency-Key (see keep): every request with such a body, in whatever
// order its members come, is decoded again and refused again, and none
// runs.
func (s *Service) decode(w http.ResponseWriter, r *http.Request, dst any) bool {
	err := decodeStrict(http.MaxBytesReader(w, r.Body, MaxBodyBytes), dst)
	if err == nil {
		return true
	}
	if isTooLarge(err) {
		writeProblem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
			fmt.Sprintf("the body must be at most %d bytes", MaxBodyBytes), nil)
		return false
	}
	detail, internal := describeJSONError(err)
	if internal {
		s.logger.InfoContext(r.Context(), "payments: request body refused", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeProblem(w, http.StatusBadRequest, "invalid-request", "Invalid request", detail, nil)
	return false
}

func isTooLarge(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb)
}

// describeJSONError is the client's sentence for a body decodeStrict
// refused. The details it passes on are made of the client's own bytes
// (a member name, an offset, a JSON kind); anything else, such as a read
// error naming the server's socket, gets a fixed sentence, and internal is
// true so that the caller logs the error instead.
func describeJSONError(err error) (detail string, internal bool) {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var be *bodyError
	switch {
	case errors.Is(err, errBodyUnreadable):
		return "the request body could not be read", true
	case errors.As(err, &be):
		return be.detail, false
	case errors.Is(err, io.EOF):
		return "the body is empty; a JSON object is expected", false
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the body is truncated JSON", false
	case errors.As(err, &syntax):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, syntax), false
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Sprintf("the body must be a JSON object, not %s", typ.Value), false
		}
		return fmt.Sprintf("field %s must be %s, not %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value), false
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return strings.TrimPrefix(err.Error(), "json: "), false
	default:
		return "the body could not be decoded", true
	}
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"):
		return "an integer"
	case goKind == "string":
		return "a string"
	default:
		return "a " + goKind
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, "internal", "Internal error", "the answer could not be encoded", nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeProblem(w http.ResponseWriter, status int, slug, title, detail string, extra map[string]any) {
	p := &idemhttp.Problem{
		Type:   ProblemTypePrefix + slug,
		Title:  title,
		Status: status,
		Detail: detail,
		Extra:  extra,
	}
	p.Write(w)
}

// failWrite answers a failed write. In the two-store form, a write whose
// commit may have happened must not be answered: any answer other than a
// kept one makes the middleware release the key, and the retry would then
// claim it anew, with a new claim time that the unique constraint does not
// know, and charge again. Cutting the connection instead (as a crash would)
// keeps the key in flight until its lease ends; the retry that takes it over
// keeps the claim time and finds the payment if the commit did happen.
func (s *Service) failWrite(w http.ResponseWriter, r *http.Request, o origin, err error) {
	if s.twoStores && !o.none() && errors.Is(err, errOutcomeUnknown) {
		s.logger.ErrorContext(r.Context(), "payments: the write may or may not have committed; leaving the idempotency key in flight until its lease ends, so the retry that takes it over finds out",
			"method", r.Method, "path", r.URL.Path, "err", err)
		panic(http.ErrAbortHandler)
	}
	s.fail(w, r, err)
}

// fail answers err as a problem. Refusals the client can act on get their
// own type; anything else is logged and answered without internals.
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error) {
	var fe *FieldError
	switch {
	case errors.Is(err, ErrAccountNotFound):
		writeProblem(w, http.StatusNotFound, "account-not-found", "Account not found",
			"no such account for this API key", nil)
	case errors.Is(err, ErrPaymentNotFound):
		writeProblem(w, http.StatusNotFound, "payment-not-found", "Payment not found",
			"no such payment for this API key", nil)
	case errors.Is(err, ErrRefundNotFound):
		writeProblem(w, http.StatusNotFound, "refund-not-found", "Refund not found",
			"no such refund for this API key", nil)
	case errors.Is(err, ErrRefundExceedsPayment):
		writeProblem(w, http.StatusConflict, "refund-exceeds-payment", "Refund exceeds the payment",
			"the payment's refunds would sum past its amount (or it is refunded in full already)", nil)
	case errors.Is(err, ErrCardDeclined):
		writeProblem(w, http.StatusPaymentRequired, "card-declined", "Card declined",
			"the card network declined the charge", nil)
	case errors.Is(err, errAcquirerRefused):
		s.logger.ErrorContext(r.Context(), "payments: the card network refused the charge", "err", err)
		writeProblem(w, http.StatusBadGateway, "card-network-refused", "Card network refused the charge",
			"the card network refused the charge for a reason of its own; retry it with the same Idempotency-Key", nil)
	case errors.Is(err, ErrInsufficientFunds):
		writeProblem(w, http.StatusPaymentRequired, "insufficient-funds", "Insufficient funds",
			"the account's balance is smaller than the amount", nil)
	case errors.Is(err, ErrKeyConflict):
		writeProblem(w, http.StatusUnprocessableEntity, "idempotency-key-conflict", "Idempotency key already used",
			"an earlier execution of this Idempotency-Key recorded a different operation (account, amount or currency); use a new key for a new operation", nil)
	case errors.Is(err, ErrBalanceOverflow):
		writeProblem(w, http.StatusConflict, "balance-overflow", "Balance too large",
			"the deposit would take the balance past the largest amount that can be held", nil)
	case errors.Is(err, ErrCurrencyMismatch) && errors.As(err, &fe):
		writeProblem(w, http.StatusBadRequest, "currency-mismatch", "Currency mismatch", fe.Error(),
			map[string]any{"field": fe.Field})
	case errors.As(err, &fe):
		writeProblem(w, http.StatusBadRequest, "invalid-request", "Invalid request", joinedDetail(err),
			map[string]any{"field": fe.Field})
	case errors.Is(err, errOutcomeUnknown):
		s.logger.ErrorContext(r.Context(), "payments: the write may or may not have committed", "method", r.Method, "path", r.URL.Path, "err", err)
		(&idemhttp.Problem{
			Type:       ProblemTypePrefix + "outcome-unknown",
			Title:      "Outcome unknown",
			Status:     http.StatusServiceUnavailable,
			Detail:     "the database failed while committing: the request may or may not have taken effect; retry it with the same Idempotency-Key",
			RetryAfter: 1,
		}).Write(w)
	case errors.Is(err, ErrTransient), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		s.logger.WarnContext(r.Context(), "payments: transient failure", "method", r.Method, "path", r.URL.Path, "err", err)
		(&idemhttp.Problem{
			Type:       ProblemTypePrefix + "temporarily-unavailable",
			Title:      "Temporarily unavailable",
			Status:     http.StatusServiceUnavailable,
			Detail:     "the request failed before anything was committed; retry it with the same Idempotency-Key",
			RetryAfter: 1,
		}).Write(w)
	default:
		s.logger.ErrorContext(r.Context(), "payments: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeProblem(w, http.StatusInternalServerError, "internal", "Internal error",
			"the request failed; retry it with the same Idempotency-Key", nil)
	}
}

// joinedDetail renders one or several validation errors (errors.Join) as one
// sentence list.
func joinedDetail(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// originOf is the origin of r's write: its key's claim, and, when the keys
// live apart from the money, the window of the key's TTL on both sides of
// that claim, in which another claim of the key is the same logical
// request's (see origin).
func (s *Service) originOf(r *http.Request) origin {
	o := originFrom(r.Context())
	if s.twoStores && !o.none() {
		o.since, o.until = o.claimedAt.Add(-s.keyTTL), o.claimedAt.Add(s.keyTTL)
	}
	return o
}
