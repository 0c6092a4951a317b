package idemamqp_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
)

// muteProxy forwards AMQP connections to a broker and, once muted, drops
// what the broker sends on the channels of the connections open then,
// passing on only the connection's own frames (channel 0: heartbeats,
// close): a broker whose channels take frames and answer nothing, on a
// connection that lives on. Connections opened after are forwarded whole.
type muteProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[*proxied]bool
}

type proxied struct {
	client, broker net.Conn
	mu             sync.Mutex
	muted          bool
}

func newMuteProxy(t *testing.T, target string) *muteProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &muteProxy{ln: ln, target: target, conns: map[*proxied]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.client.Close()
			c.broker.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			broker, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			c := &proxied{client: client, broker: broker}
			p.mu.Lock()
			p.conns[c] = true
			p.mu.Unlock()
			end := func() {
				client.Close()
				broker.Close()
				p.mu.Lock()
				delete(p.conns, c)
				p.mu.Unlock()
			}
			wg.Go(func() {
				defer end()
				_, _ = io.Copy(broker, client)
			})
			wg.Go(func() {
				defer end()
				// Frame by frame: type (1 byte), channel (2), size (4),
				// payload, frame end (1).
				r := bufio.NewReader(broker)
				head := make([]byte, 7)
				for {
					if _, err := io.ReadFull(r, head); err != nil {
						return
					}
					frame := make([]byte, 7+int(binary.BigEndian.Uint32(head[3:]))+1)
					copy(frame, head)
					if _, err := io.ReadFull(r, frame[7:]); err != nil {
						return
					}
					c.mu.Lock()
					muted := c.muted
					c.mu.Unlock()
					if muted && binary.BigEndian.Uint16(head[1:3]) != 0 {
						continue
					}
					if _, err := client.Write(frame); err != nil {
						return
					}
				}
			})
		}
	})
	return p
}

// mute silences the broker on the connections open now.
func (p *muteProxy) mute() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.mu.Lock()
		c.muted = true
		c.mu.Unlock()
	}
}

// url is brokerURL with its host replaced by the proxy's.
func (p *muteProxy) url(t *testing.T, brokerURL string) string {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

// TestDelayedNackOnABrokerThatStopsAnswering: a broker that takes the
// delayed copy and then answers nothing more on the connection (seen on a
// RabbitMQ restarted again and again) does not hold the Nack, or the
// transport's publishing, for good: the Nack returns, the connection is
// dropped, and the message, held by a consumer of that connection, is
// delivered again on a new one.
func TestDelayedNackOnABrokerThatStopsAnswering(t *testing.T) {
	t.Parallel()
	brokerURL := amqpURL(t)
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	p := newMuteProxy(t, u.Host)
	tr := newIsolatedAt(t, p.url(t, brokerURL), idemamqp.Config{})
	s, d := deliveredOne(t, tr)
	// Unmuted, a first delayed Nack declares the 100ms delay queue.
	if err := d.Nack(t.Context(), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	d = next(t, s)

	// Muted, a copy to it gets no confirm; a copy to the 200ms one, which
	// must be declared first, gets no answer to channel.open.
	for _, delay := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond} {
		p.mute()
		nacked := make(chan error, 1)
		go func() { nacked <- d.Nack(context.Background(), delay) }()
		select {
		case <-nacked:
		case <-time.After(30 * time.Second):
			t.Fatalf("Nack(%s) still waits for a broker that answers nothing, after 30s", delay)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		again, err := s.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("after Nack(%s), no delivery again once the connection was dropped: %v", delay, err)
		}
		if again.Message().ID != "m1" {
			t.Fatalf("delivered again: %q, want m1", again.Message().ID)
		}
		d = again
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(t.Context(), idem.Message{ID: "m2", Topic: "t"}); err != nil {
		t.Errorf("publishing after the connection was dropped: %v", err)
	}
}
