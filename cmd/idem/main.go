package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
)

func main() {
	// go-redis logs dial failures on its own, several lines each; the key
	// store reports the same failures as errors, which the command prints
	// once, on one line.
	redis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, give the default handling back, so a
		// second Ctrl-C ends a shutdown that hangs.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command line, testable: it parses args, runs the command
// until it ends or ctx is cancelled, writes to stdout and stderr, and
// returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, lookupEnv: os.LookupEnv}
	return a.run(ctx, args)
}

// quietRedis discards go-redis's own log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
