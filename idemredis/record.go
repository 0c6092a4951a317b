package idemredis

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem"
)

// A record is one Redis string, so that a new key's claim is the single
// native command SET … NX PX … GET, with its lifetime in Redis set by the
// same command. Its layout (numbers in decimal, times in µs since the Unix
// epoch, durations in µs, SP a single space):
//
//	in flight:  i<w><token> SP <created> SP <leased> SP <lease> SP <ttl> SP <fplen> SP <fingerprint>
//	completed:  c<w><token> … <fingerprint> SP <completed> SP <status> SP <omitted> SP <hdrlen> SP <header><body>
//	tombstone:  r-<token>
//
// <w> is '-', or 'w' once a WaitChange waits on the record: only then do
// its completion and release publish the change (a takeover always does).
// leased is when the current lease began (the claim, or the last takeover),
// so the lease ends at leased+lease and the record's TTL at created+ttl. A
// claim writes the record without arithmetic: the time, three times over,
// then the lease, TTL and fingerprint, whether the process writes it
// (newRecord, for SET … NX) or the claim script does. Completion keeps the
// in-flight text after its first byte unchanged and appends the completion
// time and the response, so neither the script nor the native SET … IFEQ
// parses anything. The fingerprint is length-prefixed because a completed
// record continues after it; the header is length-prefixed because the
// body follows it; the body runs to the end. omitted is 1 when the body
// was too large to keep.
//
// A tombstone is what Release and Purge leave in place of a record: the
// key counts as absent (Get says ErrNotFound, Release succeeds), but Redis
// keeps the token until its clock has passed it by tombstoneLife, so the
// key's next claim, which finds the tombstone, gets a greater one (see
// doc.go, "Fencing tokens").
//
// The header is a sequence of names, each a netstring (<len>:<bytes>)
// followed by its number of values and ':', then that many value
// netstrings, so that names and values may hold any byte, a name may have
// no values, and an empty value survives.

// Record states, the first byte of a record, and waiter flags, the second.
const (
	stateInFlight  = 'i'
	stateCompleted = 'c'
	stateTombstone = 'r'
	notWaited      = '-'
	waited         = 'w'
)

// tombstoneLife is how long Redis keeps a tombstone after its clock has
// passed the token: far more than the error of any clock estimate, and long
// enough that the retry of a released request, which usually follows at
// once, is judged against it.
const tombstoneLife = 10 * time.Second

// newRecord appends the in-flight record a claim at now writes, with the
// request's tail (see claimSuffix): "i-<token> <now> <now>" and the tail.
// A new key's token is the time itself.
func newRecord(b []byte, token, now int64, suffix []byte) []byte {
	b = append(b, stateInFlight, notWaited)
	b = strconv.AppendInt(b, token, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, now, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, now, 10)
	return append(b, suffix...)
}

// claimSuffix appends what follows the times in a new record:
// " <lease> <ttl> <fplen> <fingerprint>".
func claimSuffix(b []byte, lease, ttl int64, fp idem.Fingerprint) []byte {
	b = append(b, ' ')
	b = strconv.AppendInt(b, lease, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, ttl, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(fp)), 10)
	b = append(b, ' ')
	return append(b, fp...)
}

// completedRecord appends the completed record that the complete script
// would make of the in-flight record old at now: the same, with 'c' first,
// then SP <now> and the completion (appendCompletion).
func completedRecord(b []byte, old string, now int64, completion []byte) []byte {
	b = append(b, stateCompleted)
	b = append(b, old[1:]...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, now, 10)
	return append(b, completion...)
}

// headerReadLen is enough bytes of a record to hold everything before the
// fingerprint (the state, six numbers and their spaces); Purge reads only
// this much of each record.
const headerReadLen = 160

// errNotRecord is wrapped by every parse error: the value is not a record
// this package wrote.
var errNotRecord = errors.New("not an idemredis record")

// recordHeader is the part of a record before the fingerprint.
type recordHeader struct {
	state   byte
	token   int64
	created int64 // µs
	leased  int64 // µs, when the current lease began
	lease   int64 // µs
	ttl     int64 // µs
	fpStart int   // offset of the fingerprint in the record
	fpEnd   int
}

// liveAt reports whether the record counts at now (its TTL has not passed
// or a live lease holds it), as the scripts judge it.
func (h *recordHeader) liveAt(now int64) bool {
	return now < h.created+h.ttl || (h.state == stateInFlight && now < h.leased+h.lease)
}

// fieldReader reads the space-separated fields of a record.
type fieldReader struct {
	s   string
	pos int
	err error
}

// int reads a decimal integer (with an optional '-') ending at sep.
func (sc *fieldReader) int(sep byte) int64 {
	if sc.err != nil {
		return 0
	}
	end := sc.pos
	for end < len(sc.s) && sc.s[end] != sep {
		end++
	}
	if end == len(sc.s) {
		sc.err = fmt.Errorf("%w: field at offset %d has no %q after it", errNotRecord, sc.pos, sep)
		return 0
	}
	n, err := strconv.ParseInt(sc.s[sc.pos:end], 10, 64)
	if err != nil {
		sc.err = fmt.Errorf("%w: field at offset %d is not an integer", errNotRecord, sc.pos)
		return 0
	}
	sc.pos = end + 1
	return n
}

// bytes reads n bytes.
func (sc *fieldReader) bytes(n int64) string {
	if sc.err != nil {
		return ""
	}
	if n < 0 || n > int64(len(sc.s)-sc.pos) {
		sc.err = fmt.Errorf("%w: %d bytes at offset %d run past the end", errNotRecord, n, sc.pos)
		return ""
	}
	b := sc.s[sc.pos : sc.pos+int(n)]
	sc.pos += int(n)
	return b
}

// parseHeader reads the fields before the fingerprint. It needs only the
// first headerReadLen bytes of a record, but checks that the fingerprint
// fits when given the whole record.
func parseHeader(v string, whole bool) (recordHeader, error) {
	if len(v) < 2 || (v[0] != stateInFlight && v[0] != stateCompleted) || (v[1] != notWaited && v[1] != waited) {
		return recordHeader{}, fmt.Errorf("%w: unknown state", errNotRecord)
	}
	sc := fieldReader{s: v, pos: 2}
	h := recordHeader{state: v[0]}
	h.token = sc.int(' ')
	h.created = sc.int(' ')
	h.leased = sc.int(' ')
	h.lease = sc.int(' ')
	h.ttl = sc.int(' ')
	fpLen := sc.int(' ')
	if sc.err != nil {
		return recordHeader{}, sc.err
	}
	h.fpStart = sc.pos
	if whole {
		sc.bytes(fpLen)
		if sc.err != nil {
			return recordHeader{}, sc.err
		}
	}
	h.fpEnd = h.fpStart + int(fpLen)
	return h, nil
}

// usTime returns the time at µs since the epoch, in UTC.
func usTime(us int64) time.Time { return time.UnixMicro(us).UTC() }

// parseRecord decodes a whole record of scope's key.
func parseRecord(scope idem.Scope, key idem.Key, v string) (idem.Record, error) {
	rec, _, err := parseRecordHeader(scope, key, v)
	return rec, err
}

// parseRecordHeader decodes a whole record of scope's key, and returns its
// header too.
func parseRecordHeader(scope idem.Scope, key idem.Key, v string) (idem.Record, recordHeader, error) {
	h, err := parseHeader(v, true)
	if err != nil {
		return idem.Record{}, h, err
	}
	rec := idem.Record{
		Scope:          scope,
		Key:            key,
		Fingerprint:    idem.Fingerprint(v[h.fpStart:h.fpEnd]),
		Token:          idem.Token(h.token),
		CreatedAt:      usTime(h.created),
		LeaseExpiresAt: usTime(h.leased + h.lease),
		ExpiresAt:      usTime(h.created + h.ttl),
	}
	rest := v[h.fpEnd:]
	if h.state == stateInFlight {
		if rest != "" {
			return idem.Record{}, h, fmt.Errorf("%w: %d bytes after an in-flight record", errNotRecord, len(rest))
		}
		rec.State = idem.StateInFlight
		return rec, h, nil
	}
	if rest == "" || rest[0] != ' ' {
		return idem.Record{}, h, fmt.Errorf("%w: completed record without a response", errNotRecord)
	}
	sc := fieldReader{s: rest, pos: 1}
	completed := sc.int(' ')
	status := sc.int(' ')
	omitted := sc.int(' ')
	hdr := sc.bytes(sc.int(' '))
	if sc.err != nil {
		return idem.Record{}, h, sc.err
	}
	header, err := decodeHeader(hdr)
	if err != nil {
		return idem.Record{}, h, err
	}
	rec.State = idem.StateCompleted
	rec.CompletedAt = usTime(completed)
	rec.Response = &idem.Response{
		Status:      int(status),
		Header:      header,
		Body:        []byte(rest[sc.pos:]),
		BodyOmitted: omitted == 1,
	}
	return rec, h, nil
}

// appendCompletion appends what the complete script adds after the
// completion time: SP <status> SP <omitted> SP <hdrlen> SP <header><body>.
func appendCompletion(b []byte, resp *idem.Response) []byte {
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(resp.Status), 10)
	if resp.BodyOmitted {
		b = append(b, " 1 "...)
	} else {
		b = append(b, " 0 "...)
	}
	b = strconv.AppendInt(b, int64(headerLen(resp.Header)), 10)
	b = append(b, ' ')
	b = appendHeader(b, resp.Header)
	return append(b, resp.Body...)
}

// completionLen is the length appendCompletion appends, give or take the
// status's digits: enough to size its buffer once.
func completionLen(resp *idem.Response) int {
	return 48 + headerLen(resp.Header) + len(resp.Body)
}

func netstringLen(n int) int { return decimalLen(n) + 1 + n }

func decimalLen(n int) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// headerLen is the length of h encoded by appendHeader.
func headerLen(h http.Header) int {
	n := 0
	for name, values := range h {
		n += netstringLen(len(name)) + decimalLen(len(values)) + 1
		for _, v := range values {
			n += netstringLen(len(v))
		}
	}
	return n
}

func appendNetstring(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// appendHeader encodes h: each name as a netstring, its number of values
// and ':', then each value as a netstring.
func appendHeader(b []byte, h http.Header) []byte {
	for name, values := range h {
		b = appendNetstring(b, name)
		b = strconv.AppendInt(b, int64(len(values)), 10)
		b = append(b, ':')
		for _, v := range values {
			b = appendNetstring(b, v)
		}
	}
	return b
}

// decodeHeader decodes what appendHeader wrote; nil for no names.
func decodeHeader(s string) (http.Header, error) {
	if s == "" {
		return nil, nil
	}
	sc := fieldReader{s: s}
	h := make(http.Header)
	for sc.pos < len(s) && sc.err == nil {
		name := sc.bytes(sc.int(':'))
		n := sc.int(':')
		if sc.err != nil {
			break
		}
		if n < 0 || n > int64(len(s)) {
			return nil, fmt.Errorf("%w: header %q has %d values", errNotRecord, name, n)
		}
		values := make([]string, n)
		for i := range values {
			values[i] = sc.bytes(sc.int(':'))
		}
		h[name] = values
	}
	if sc.err != nil {
		return nil, fmt.Errorf("header: %w", sc.err)
	}
	return h, nil
}
