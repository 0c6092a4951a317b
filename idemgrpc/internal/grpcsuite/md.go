package grpcsuite

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/idem-go/idem/idemgrpc"
)

type mdHolder struct{ MD metadata.MD }

func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
}
