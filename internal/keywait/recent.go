package keywait

import (
	"encoding/binary"
	"hash/maphash"
	"net/http"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Recent remembers the last keys this process saw completed, up to a
// bound, oldest forgotten first: a duplicate of one of them is most likely
// a replay, which one read of the store answers (see keyed's
// Config.RecentKeys). Remembering a key that has since
// expired, or been deleted, costs only that read: the request is then
// claimed as any other.
//
// For a while after the completion it also keeps the answer itself (see
// keyed's Config.MemoryReplayFor), so that a duplicate reaching this
// process then is answered with no read at all. A completed record does not change
// until it expires, so the kept answer is the one the store would give,
// as long as the record lives: an answer is kept no longer than
// MemoryReplayFor, and never past the record's expiry less
// MemoryReplayFor, which leaves that much room for the difference between
// the store's clock and this process's.
//
// Its memory is laid out for the garbage collector, which otherwise spent
// more of a busy process's time marking the tens of thousands of keys and
// answers held here than the middleware spent on anything else: the index
// maps a hash of each key to its slot and holds no pointers, and each slot
// holds one pointer, to its answer encoded in a single byte slice that
// holds none (with the key and the fingerprint, so that a hash shared by
// two keys never hands one key's answer to the other). A key is known by
// its hash alone: two keys sharing one (once in 2^64) cost at most a read
// of the store, as a key remembered after its record expired does.
type Recent struct {
	clock    idem.Clock
	keepFor  time.Duration // 0: no answers kept
	maxBytes int
	seed     maphash.Seed

	mu    sync.Mutex
	index map[uint64]int32 // a key's hash -> its slot
	// slots are the keys remembered, oldest at head, in a ring of
	// cap(slots) = the most keys remembered.
	slots []recentSlot
	head  int
	n     int
	bytes int // the sizes of the answers kept
}

// recentSlot is one key remembered, with its answer while that is kept.
type recentSlot struct {
	hash   uint64
	until  int64  // Unix nanoseconds; the answer is kept before it
	answer []byte // encodeAnswer's; nil: only the key is remembered
}

// NewRecent remembers up to n keys (none when n <= 0), and with
// keepFor > 0 their answers for that long, up to maxBytes of them.
func NewRecent(n int, keepFor time.Duration, maxBytes int, clock idem.Clock) *Recent {
	if n <= 0 {
		return nil
	}
	return &Recent{clock: clock, keepFor: max(keepFor, 0), maxBytes: maxBytes, seed: maphash.MakeSeed(),
		index: make(map[uint64]int32, n), slots: make([]recentSlot, n)}
}

func (r *Recent) hash(k Key) uint64 { return maphash.Comparable(r.seed, k) }

// Lookup reports whether k was seen completed lately, and returns the
// answer kept for it when its request had fingerprint fp and the answer is
// still kept; nil otherwise (the store then answers, a mismatch
// included). The answer is the caller's own copy. A nil recentKeys
// remembers nothing.
func (r *Recent) Lookup(k Key, fp idem.Fingerprint) (resp *idem.Response, seen bool) {
	if r == nil {
		return nil, false
	}
	h := r.hash(k)
	now := r.clock.Now().UnixNano()
	r.mu.Lock()
	i, ok := r.index[h]
	if !ok {
		r.mu.Unlock()
		return nil, false
	}
	s := &r.slots[i]
	if s.answer != nil && now >= s.until {
		r.bytes -= len(s.answer)
		s.answer = nil
	}
	enc := s.answer
	r.mu.Unlock()
	if enc == nil {
		return nil, true
	}
	// enc is never written again once made (a new answer is a new slice),
	// so it is decoded outside the lock.
	resp, ok = decodeAnswer(enc, k, fp)
	if !ok {
		return nil, true
	}
	return resp, true
}

// Keep remembers k, completed with resp for a request of fingerprint fp,
// in a record that expires at expires (by the store's clock). The answer
// is kept, encoded, when there is time and room for it.
func (r *Recent) Keep(k Key, fp idem.Fingerprint, resp *idem.Response, expires time.Time) {
	if r == nil {
		return
	}
	var until time.Time
	var enc []byte
	if resp != nil && r.keepFor > 0 {
		now := r.clock.Now()
		until = now.Add(r.keepFor)
		if last := expires.Add(-r.keepFor); last.Before(until) {
			until = last
		}
		if now.Before(until) && len(resp.Body) <= r.maxBytes/64 {
			if enc = encodeAnswer(k, fp, resp); len(enc) > r.maxBytes/64 {
				enc = nil
			}
		}
	}
	h := r.hash(k)
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.index[h]
	if !ok {
		if r.n == len(r.slots) {
			r.forgetOldest()
		}
		i = int32((r.head + r.n) % len(r.slots))
		r.slots[i] = recentSlot{hash: h}
		r.index[h] = i
		r.n++
	}
	if enc == nil {
		return // a key remembered keeps the answer it has, if still kept
	}
	s := &r.slots[i]
	r.bytes += len(enc) - len(s.answer)
	s.answer, s.until = enc, until.UnixNano()
	for r.bytes > r.maxBytes && r.n > 1 {
		r.forgetOldest()
	}
}

// forgetOldest forgets the oldest key. r.mu is held.
func (r *Recent) forgetOldest() {
	s := &r.slots[r.head]
	r.bytes -= len(s.answer)
	delete(r.index, s.hash)
	*s = recentSlot{}
	r.head = (r.head + 1) % len(r.slots)
	r.n--
}

// encodeAnswer encodes k, fp and resp into one byte slice: lengths as
// 32-bit little-endian numbers, each before its bytes.
//
//	scope key fingerprint status flags(1: body omitted) headers(count, then
//	name and values(count, then each)) body
func encodeAnswer(k Key, fp idem.Fingerprint, resp *idem.Response) []byte {
	// Room for all but the headers, which are few and short: iterating
	// over them once more to size them exactly costs more than the
	// occasional growth.
	b := make([]byte, 0, 64+len(k.Scope)+len(k.Key)+len(fp)+len(resp.Body))
	b = appendString(b, string(k.Scope))
	b = appendString(b, string(k.Key))
	b = appendString(b, string(fp))
	b = binary.LittleEndian.AppendUint32(b, uint32(resp.Status))
	var flags byte
	if resp.BodyOmitted {
		flags = 1
	}
	b = append(b, flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(resp.Header)))
	for name, vs := range resp.Header {
		b = appendString(b, name)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(resp.Body)))
	return append(b, resp.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// decodeAnswer decodes encodeAnswer's encoding into a new Response, when it
// was made for k and fp.
func decodeAnswer(b []byte, k Key, fp idem.Fingerprint) (*idem.Response, bool) {
	d := answerDecoder{b: b}
	// string(b) == s compares without making a string of b.
	if string(d.bytes()) != string(k.Scope) || string(d.bytes()) != string(k.Key) || string(d.bytes()) != string(fp) {
		return nil, false
	}
	resp := &idem.Response{Status: int(d.uint32())}
	resp.BodyOmitted = d.byte()&1 != 0
	if n := int(d.uint32()); n > 0 {
		resp.Header = make(http.Header, n)
		for range n {
			name := d.string()
			vs := make([]string, d.uint32())
			for j := range vs {
				vs[j] = d.string()
			}
			resp.Header[name] = vs
		}
	}
	if body := d.bytes(); len(body) > 0 {
		resp.Body = append([]byte(nil), body...)
	}
	return resp, true
}

// answerDecoder reads encodeAnswer's encoding, which this package made:
// its lengths are trusted.
type answerDecoder struct{ b []byte }

func (d *answerDecoder) uint32() uint32 {
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *answerDecoder) byte() byte {
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *answerDecoder) bytes() []byte {
	n := d.uint32()
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *answerDecoder) string() string { return string(d.bytes()) }
