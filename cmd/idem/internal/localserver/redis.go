package localserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedis starts redis-server on 127.0.0.1 on a free port, its data in
// dir: an append-only file fsynced before every write is acknowledged
// (appendfsync always) and no RDB snapshots, so that a restart after a
// SIGKILL comes back with every write it acknowledged. Its log is
// dir/redis.log. It returns once the server answers and has loaded its
// data. dir is made if it does not exist.
func StartRedis(ctx context.Context, dir string) (*Server, error) {
	return startRedis(ctx, dir, true)
}

// StartVolatileRedis starts redis-server as StartRedis does, but keeping
// nothing on disk (no append-only file, no snapshots), as a Redis run as
// a cache is: every restart comes back empty, whatever it acknowledged.
func StartVolatileRedis(ctx context.Context, dir string) (*Server, error) {
	return startRedis(ctx, dir, false)
}

func startRedis(ctx context.Context, dir string, durable bool) (*Server, error) {
	bin, err := lookPath("redis", "redis-server")
	if err != nil {
		return nil, err
	}
	if err := mkdir("redis", dir); err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("localserver: redis: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ports[0])
	persistence := []string{"--appendonly", "yes", "--appendfsync", "always", "--save", ""}
	if !durable {
		persistence = []string{"--appendonly", "no", "--save", ""}
	}
	s := &Server{
		name: "redis",
		addr: "127.0.0.1:" + port,
		url:  "redis://127.0.0.1:" + port + "/0",
		log:  filepath.Join(dir, "redis.log"),
		argv: append(append([]string{bin, "--port", port, "--bind", "127.0.0.1", "--dir", dir}, persistence...),
			"--daemonize", "no", "--logfile", ""),
		env:          os.Environ(),
		dir:          dir,
		stopSignal:   syscall.SIGTERM,
		readyTimeout: time.Minute,
	}
	opts, err := redis.ParseURL(s.url)
	if err != nil {
		return nil, fmt.Errorf("localserver: redis: %w", err)
	}
	opts.MaxRetries = -1 // each probe is one try; waitReady tries again
	s.ready = func(ctx context.Context) error {
		c := redis.NewClient(opts)
		defer c.Close()
		// A server loading its append-only file answers INFO, and
		// refuses nearly everything else with LOADING.
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "loading:0") {
			return errors.New("still loading its data")
		}
		return nil
	}
	return s.launch(ctx)
}
