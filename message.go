package idem

import (
	"time"
)

// Message is what a Publisher sends and a Subscriber delivers.
type Message struct {
	// ID identifies the message. Transports pass it as the broker's own
	// message ID (JetStream Nats-Msg-Id, AMQP message_id), and consumers
	// de-duplicate by it unless told to use another key.
	ID string
	// Topic is where the message goes: a subject, a routing key, a queue.
	Topic string
	// Key orders messages: those with the same key are applied one at a
	// time, in order. Empty means no ordering constraint.
	Key string
	// Headers carry metadata beside the payload.
	Headers map[string]string
	// Payload is the message body, as bytes.
	Payload []byte
	// Time is when the message was first published.
	Time time.Time
}

// Validate reports whether m can be published.
func (m Message) Validate() error {
	switch {
	case m.ID == "":
		return &ArgumentError{Field: "Message.ID", Reason: "must not be empty"}
	case m.Topic == "":
		return &ArgumentError{Field: "Message.Topic", Reason: "must not be empty"}
	}
	return nil
}
