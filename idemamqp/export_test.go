package idemamqp

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

// BreakChannel makes the broker close the AMQP channel st consumes on, as
// a channel error does: it acknowledges a delivery tag the channel never
// had, which RabbitMQ answers with PRECONDITION_FAILED and the channel's
// close. The returned channel receives that close.
func BreakChannel(st idem.Stream) (<-chan *amqp.Error, error) {
	s := st.(*stream)
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	closed := gen.ch.NotifyClose(make(chan *amqp.Error, 1))
	return closed, gen.ch.Ack(1<<62, false)
}
