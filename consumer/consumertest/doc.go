// Package consumertest holds what a transport's author tests the consumer
// with:
//   - TestPerKeyOrder checks that consumer.Consumer keeps each key's order
//     through a real transport, across retries, applying every message
//     exactly once;
//   - RunEventFailover publishes keyed events through a transport on a
//     cluster while the test kills and restarts a node, consumes them into
//     idemmem's inbox, and counts what was missing, applied twice or out of
//     order (the cluster tests of idemnats and idemamqp use it).
//
// It lives beside the consumer it drives, in the root module, apart from
// idemtest, whose suites need nothing but the root's interfaces.
//
//	func TestPerKeyOrder(t *testing.T) {
//		tr := openTransport(t) // a fresh topic namespace
//		consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{})
//	}
package consumertest
