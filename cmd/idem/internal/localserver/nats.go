package localserver

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// StartNATS starts nats-server with JetStream on 127.0.0.1 on a free
// port, its JetStream store in dir/js, its log in dir/nats.log and an HTTP
// monitoring port of its own (on 127.0.0.1 too), and returns once
// /healthz answers 200, which it does once JetStream has recovered what it
// stored. dir is made if it does not exist.
func StartNATS(ctx context.Context, dir string) (*Server, error) {
	bin, err := lookPath("nats", "nats-server")
	if err != nil {
		return nil, err
	}
	if err := mkdir("nats", dir); err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("localserver: nats: %w", err)
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	port, monitor := strconv.Itoa(ports[0]), strconv.Itoa(ports[1])
	s := &Server{
		name: "nats",
		addr: "127.0.0.1:" + port,
		url:  "nats://127.0.0.1:" + port,
		log:  filepath.Join(dir, "nats.log"),
		// The monitoring port listens on -a's address too.
		argv:         []string{bin, "-js", "-a", "127.0.0.1", "-p", port, "-m", monitor, "-sd", filepath.Join(dir, "js")},
		env:          os.Environ(),
		dir:          dir,
		stopSignal:   syscall.SIGTERM,
		readyTimeout: time.Minute,
	}
	healthz := "http://127.0.0.1:" + monitor + "/healthz"
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	s.ready = func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, healthz, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz answered %s", resp.Status)
		}
		return nil
	}
	return s.launch(ctx)
}
