// Package consumertest holds what a transport's author tests the consumer
// with: TestPerKeyOrder checks that consumer.Consumer keeps each key's
// order through a real transport, across retries, applying every message
// exactly once. It lives beside the consumer it drives, apart from
// idemtest, whose suites need nothing but the root's interfaces.
//
//	func TestPerKeyOrder(t *testing.T) {
//		tr := openTransport(t) // a fresh topic namespace
//		consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{})
//	}
package consumertest
