package localserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// StartRabbitMQ starts a RabbitMQ node of its own on 127.0.0.1: a node
// name, AMQP and distribution ports, Erlang cookie, configuration,
// database and logs of its own under dir, and no plugins. Its output is in
// dir/rabbitmq.log and its own logs in dir/log. It returns once an AMQP
// connection opens, as guest, whom the node lets in from loopback. dir is
// made if it does not exist.
//
// A node boots in 10 to 30 seconds on a small machine, and as long again
// after each restart.
func StartRabbitMQ(ctx context.Context, dir string) (*Server, error) {
	server, err := lookPath("rabbitmq", "rabbitmq-server")
	if err != nil {
		return nil, err
	}
	server = rabbitMQProgram(server)
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("localserver: rabbitmq: %w", err)
	}
	home := filepath.Join(dir, "home")
	for _, d := range []string{home, filepath.Join(dir, "mnesia"), filepath.Join(dir, "log")} {
		if err := mkdir("rabbitmq", d); err != nil {
			return nil, err
		}
	}
	// A cookie of its own: no other node on the machine accepts it, and
	// the node talks to no other.
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("localserver: rabbitmq: %w", err)
	}
	files := map[string]string{
		filepath.Join(home, ".erlang.cookie"): hex.EncodeToString(secret),
		// Empty, so that /etc/rabbitmq/rabbitmq-env.conf, which names the
		// machine's node, stays out.
		filepath.Join(dir, "rabbitmq-env.conf"): "",
		filepath.Join(dir, "enabled_plugins"):   "[].\n",
		filepath.Join(dir, "rabbitmq.conf"):     "loopback_users = none\n",
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o400); err != nil {
			return nil, fmt.Errorf("localserver: rabbitmq: %w", err)
		}
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	amqpPort, dist := strconv.Itoa(ports[0]), strconv.Itoa(ports[1])
	node := "idem" + hex.EncodeToString(secret[:4]) + "@localhost"
	s := &Server{
		name: "rabbitmq",
		addr: "127.0.0.1:" + amqpPort,
		url:  "amqp://guest:guest@127.0.0.1:" + amqpPort + "/",
		log:  filepath.Join(dir, "rabbitmq.log"),
		argv: []string{server},
		env: append(os.Environ(),
			"HOME="+home,
			"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
			"RABBITMQ_NODENAME="+node,
			"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
			"RABBITMQ_NODE_PORT="+amqpPort,
			"RABBITMQ_DIST_PORT="+dist,
			"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
			"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
			"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
			"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
			"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
			// The launcher then execs the Erlang VM rather than running
			// it as a child and waiting: the server's process is the VM,
			// which the parent-death signal and a SIGKILL reach. Its
			// input is a pipe the caller holds, whose end (the caller's
			// death) ends the VM too.
			"RABBITMQ_ALLOW_INPUT=1",
			"ERL_CRASH_DUMP="+filepath.Join(dir, "erl_crash.dump"),
		),
		dir:          dir,
		stdinPipe:    true,
		stopSignal:   syscall.SIGTERM,
		readyTimeout: 3 * time.Minute,
	}
	s.ready = func(ctx context.Context) error {
		// The node opens its AMQP listener last, once it has booted.
		conn, err := amqp.DialConfig(s.url, amqp.Config{Dial: amqp.DefaultDial(probeTimeout)})
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return s.launch(ctx)
}

// rabbitMQProgram returns the path of a RabbitMQ program. Debian's
// /usr/sbin wrappers run the programs as the rabbitmq user, with that
// user's home and cookie, which belong to the machine's own node: the
// programs behind them, in /usr/lib/rabbitmq/bin, run as the caller.
func rabbitMQProgram(inPath string) string {
	direct := filepath.Join("/usr/lib/rabbitmq/bin", filepath.Base(inPath))
	if st, err := os.Stat(direct); err == nil && !st.IsDir() {
		return direct
	}
	return inPath
}
