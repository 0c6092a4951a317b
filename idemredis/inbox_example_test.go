package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
)

// A consumer credits a wallet kept in Redis. The credit is queued on the
// pipeliner the inbox puts in fn's context, so it commits with the record of
// the message: a redelivery of the same message credits nothing.
func ExampleInbox() {
	ctx := context.Background()
	client, prefix, err := exampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	defer deleteExampleKeys(client, prefix)

	inbox, err := idemredis.NewInbox(ctx, client, &idemredis.InboxConfig{
		Prefix: prefix,
		Lease:  30 * time.Second,
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	const consumer = "wallet-credits"
	// The hash tag keeps the wallet on the inbox keys' Redis Cluster slot,
	// which MULTI needs there; on a single Redis it changes nothing.
	wallet := prefix + ":wallet:" + idemredis.InboxHashTag(consumer) + ":alice"
	credit := func(ctx context.Context) error {
		pipe, ok := idemredis.InboxTx(ctx)
		if !ok {
			return errors.New("not in an inbox transaction")
		}
		pipe.IncrBy(ctx, wallet, 50)
		return nil
	}

	// The transport delivers message "pay-1" twice.
	for range 2 {
		err := inbox.Process(ctx, consumer, "pay-1", credit)
		switch {
		case errors.Is(err, idem.ErrDuplicate):
			fmt.Println("duplicate: acknowledged without crediting")
		case err != nil:
			fmt.Println(err)
			return
		default:
			fmt.Println("credited")
		}
	}
	balance, err := client.Get(ctx, wallet).Int()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("balance:", balance)
	// Output:
	// credited
	// duplicate: acknowledged without crediting
	// balance: 50
}
