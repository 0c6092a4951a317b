package idemsqlite

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// A statement is SQL the package runs on its hot paths. Each DB prepares
// it once and runs the prepared copy from then on: parsing and planning
// the text costs SQLite more than running most of these statements does.
//
// Statements are package-level values made by messagesSQL or keysSQL, so
// the text never varies: lists of values travel as one JSON array argument
// (json_each), never as a varying number of placeholders.
type statement struct {
	sql string
}

// statements are all the package's statements, registered by their
// declarations under the component whose migrations create their tables:
// they can be prepared once those have run.
var statements = map[string][]*statement{}

// messagesSQL declares a statement on the message tables.
func messagesSQL(sql string) *statement { return declare(MessagesComponent, sql) }

// keysSQL declares a statement on the store's table.
func keysSQL(sql string) *statement { return declare(StoreComponent, sql) }

func declare(component, sql string) *statement {
	s := &statement{sql: sql}
	statements[component] = append(statements[component], s)
	return s
}

// stmtCache holds a DB's prepared statements: on the writer, every
// statement of each component a constructor has migrated, prepared then;
// on the read pool, each statement that ran there, prepared on first use.
//
// Looking one up takes no lock, so a transaction looking up its statements
// never waits for a constructor that is preparing others and waits, in
// turn, for the writer connection that transaction holds. A statement
// prepared on the read pool while Close runs may escape close; the pool's
// Close then frees it.
type stmtCache struct {
	writer sync.Map // *statement → *sql.Stmt
	reader sync.Map // *statement → *sql.Stmt

	mu       sync.Mutex // held while preparing on the writer
	prepared map[string]bool
	closed   atomic.Bool

	// unprepared counts the runs of a statement that had no prepared
	// copy, and ran as text: tests see that the hot paths have one.
	unprepared atomic.Int64
}

// prepare prepares, on the writer, every statement of component that is
// not prepared yet. Constructors call it once component's migrations have
// run, outside any transaction: preparing needs the writer's connection.
func (db *DB) prepare(ctx context.Context, component string) error {
	c := &db.stmts
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("idemsqlite: prepare the statements of %s: %w", component, sql.ErrConnDone)
	}
	if c.prepared[component] {
		return nil
	}
	for _, s := range statements[component] {
		if _, ok := c.writer.Load(s); ok {
			continue
		}
		p, err := db.writer.PrepareContext(ctx, s.sql)
		if err != nil {
			return fmt.Errorf("idemsqlite: prepare %s: %w", abbreviate(s.sql), err)
		}
		c.writer.Store(s, p)
	}
	if c.prepared == nil {
		c.prepared = make(map[string]bool)
	}
	c.prepared[component] = true
	return nil
}

// readerStmt returns s prepared on the read pool, preparing it now if it
// is not yet, or nil when that fails (the DB is closed, say): the caller
// then runs the text, and gets the failure from there.
func (db *DB) readerStmt(ctx context.Context, s *statement) *sql.Stmt {
	if p, ok := db.stmts.reader.Load(s); ok {
		return p.(*sql.Stmt)
	}
	if db.stmts.closed.Load() {
		return nil
	}
	p, err := db.reader.PrepareContext(ctx, s.sql)
	if err != nil {
		return nil
	}
	if prev, loaded := db.stmts.reader.LoadOrStore(s, p); loaded {
		// Another goroutine prepared it meanwhile.
		p.Close()
		return prev.(*sql.Stmt)
	}
	return p
}

// close closes every prepared statement; those prepared later are not
// kept. The pools' Close would free them in SQLite anyway, but not the
// *sql.Stmt values database/sql keeps for them.
func (c *stmtCache) close() {
	c.closed.Store(true)
	for _, m := range []*sync.Map{&c.writer, &c.reader} {
		m.Range(func(k, v any) bool {
			v.(*sql.Stmt).Close()
			return true
		})
	}
}

// abbreviate returns the first words of a statement, to name it in an
// error.
func abbreviate(sql string) string {
	words := strings.Fields(sql)
	if len(words) > 6 {
		words = append(words[:6], "…")
	}
	return strings.Join(words, " ")
}

// runner runs statements in a transaction of the DB, on the writer's
// prepared copies, or, when tx is nil, on the read pool.
type runner struct {
	db *DB
	tx *sql.Tx
}

// in returns a runner of statements in tx, a transaction of db.
func (db *DB) in(tx *sql.Tx) runner { return runner{db: db, tx: tx} }

// onReader returns a runner of statements on the read pool.
func (db *DB) onReader() runner { return runner{db: db} }

// stmt returns s ready to run, or nil when s is not prepared on the DB,
// which happens only before its component's constructor ran. In a
// transaction, it is the writer's prepared statement bound to the
// transaction, which database/sql runs on the transaction's connection,
// where it is prepared already (and prepares it again on a new
// connection, after the old one failed).
func (r runner) stmt(ctx context.Context, s *statement) *sql.Stmt {
	if r.tx == nil {
		return r.db.readerStmt(ctx, s)
	}
	p, ok := r.db.stmts.writer.Load(s)
	if !ok {
		return nil
	}
	return r.tx.StmtContext(ctx, p.(*sql.Stmt))
}

// bind returns s bound to the runner, to run once or many times.
func (r runner) bind(ctx context.Context, s *statement) bound {
	p := r.stmt(ctx, s)
	if p == nil {
		r.db.stmts.unprepared.Add(1)
	}
	return bound{r: r, s: s, p: p}
}

func (r runner) exec(ctx context.Context, s *statement, args ...any) (sql.Result, error) {
	return r.bind(ctx, s).exec(ctx, args...)
}

func (r runner) query(ctx context.Context, s *statement, args ...any) (*sql.Rows, error) {
	return r.bind(ctx, s).query(ctx, args...)
}

func (r runner) queryRow(ctx context.Context, s *statement, args ...any) *sql.Row {
	return r.bind(ctx, s).queryRow(ctx, args...)
}

// queryer returns what runs text on the runner: the transaction, or the
// read pool. Only SQL whose text varies goes there unprepared.
func (r runner) queryer() queryer {
	if r.tx == nil {
		return r.db.reader
	}
	return r.tx
}

// bound is a statement bound to a runner: its prepared copy, or its text
// when it has none.
type bound struct {
	r runner
	s *statement
	p *sql.Stmt
}

func (b bound) exec(ctx context.Context, args ...any) (sql.Result, error) {
	if b.p != nil {
		return b.p.ExecContext(ctx, args...)
	}
	return b.r.queryer().ExecContext(ctx, b.s.sql, args...)
}

func (b bound) query(ctx context.Context, args ...any) (*sql.Rows, error) {
	if b.p != nil {
		return b.p.QueryContext(ctx, args...)
	}
	return b.r.queryer().QueryContext(ctx, b.s.sql, args...)
}

func (b bound) queryRow(ctx context.Context, args ...any) *sql.Row {
	if b.p != nil {
		return b.p.QueryRowContext(ctx, args...)
	}
	return b.r.queryer().QueryRowContext(ctx, b.s.sql, args...)
}

// jsonInts returns ns as a JSON array, for json_each.
func jsonInts(ns []int64) string {
	b := make([]byte, 0, 2+len(ns)*8)
	b = append(b, '[')
	for i, n := range ns {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, n, 10)
	}
	return string(append(b, ']'))
}

// jsonHex returns ss as a JSON array of their bytes in hex, for
// json_each: statements read each back with CAST(unhex(value) AS TEXT),
// byte for byte, where a JSON string would not carry bytes that are not
// UTF-8.
func jsonHex(ss []string) string {
	n := 2
	for _, s := range ss {
		n += 2*len(s) + 3
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = hex.AppendEncode(b, []byte(s))
		b = append(b, '"')
	}
	return string(append(b, ']'))
}
