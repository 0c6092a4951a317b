// Package stream is idemkafka's consumer stream: one member of a consumer
// group, handing out the records of the partitions the group assigns it,
// committing each partition's offset only past records settled, holding
// no more than MaxInFlight records in memory, and finishing or giving back
// what it holds of a partition when a rebalance takes it away.
//
// It lives apart from package idemkafka, behind the Client interface, so
// that tests can put a fake client under it and drive the rebalances, the
// polls and the commits in any order (the tests of this package, and the
// model-based test of module idemkafka/internal/streammodel).
//
// What it rests on from franz-go: a poll that begins after
// kgo.OnPartitionsRevoked was called returns no record of the revoked
// partitions (franz-go invalidates them first); kgo.OnPartitionsAssigned
// is called before the assigned partitions are fetched; and the callbacks
// are never called concurrently. What it does not rest on: a poll under
// way when a callback begins may return records of a partition taken
// away, and on a lost session franz-go drops what it buffered only after
// kgo.OnPartitionsLost returns. The stream therefore takes in no record
// of a partition being revoked, and each callback waits for the poll
// under way before it changes what the stream holds (see fenceLocked).
package stream
