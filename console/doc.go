// Package console is the operators' web console for dead letters: what to
// do with a message a consumer gave up on is usually a business owner's
// decision, and this is where they read it, in a form people read, and
// act on it. It is server-rendered (html/template, its templates and
// stylesheet embedded), runs no script, and works in any browser.
//
//	con, err := console.New(&console.Config{
//		Letters:   svc,      // a *deadletter.Service
//		Insights:  insights, // payments.ConsoleInsights(db), optional
//		Operators: ops,      // console.ParseOperators("alice:TOKEN,bob:TOKEN2")
//	})
//	…
//	mux.Handle("/console/", con.Handler())
//
// `idem serve --console` mounts it beside the payment service's API, and
// `idem console --db …` serves it alone over the service's database.
//
// # Pages
//
//   - Overview (/console/): the dead letters waiting per consumer, with the
//     age of the oldest; with Insights, each consumer's outcomes over the
//     last hour (processed, retrying, dead-lettered, re-driven, discarded)
//     and the backlogs (for the payment service, the outbox and the
//     settlement lag).
//
//   - Dead letters (/console/letters): filtered by consumer, class, state,
//     time of the last failure (since=1h, or an RFC 3339 time) and text in
//     the last error (q=, ignoring case); counts and the oldest per
//     consumer; the messages parked behind each letter; pages of
//     Config.PageSize, each leading to the next by a cursor (after=, the
//     last letter shown). The store filters by consumer, class, state and
//     time; the text search and the paging run over what it returns.
//
//   - One letter (/console/letters/{id}): the payload (JSON indented and
//     coloured; other text as text; anything else as a hex dump; in every
//     form, control and invisible characters shown as escapes, so a
//     payload cannot disguise what it holds), headers, topic, key, the
//     attempts as a timeline, the history (who did what, when, why), and
//     the messages of its key parked behind it, in the order they will
//     follow it. The parked messages are read by a dry run of a re-drive,
//     in a transaction that is rolled back. Once re-driven, with Insights,
//     whether its consumer has processed it.
//
//   - Unknown outcomes (/console/outcomes), with Config.Recoveries: the
//     executions stopped at a recovery point whose holder is gone, being
//     finished within Config.CompletionBound of their holder's lease end,
//     unknown past it or once a resume failed; for each, what its point
//     says (Config.ShowPoint, shown as text) and its failed resumes (how
//     many, the last error). The overview counts them beside the dead
//     letters.
//
//   - One key (/console/outcomes/key?scope=…&key=…): its state, its point,
//     its failed resumes, its history (Config.KeyHistory) and, while it is
//     stopped, the actions below; once settled, its kept answer's status.
//
// # Actions on unknown outcomes
//
// With Config.Actions (the service's completer, keyed.Completer) and
// Config.KeyHistory, each action is asked for on a confirmation page
// (/console/outcomes/act, which checks by a dry run that it can be taken)
// and taken by that page's form, with a reason the operator must type and
// a box they must tick; without either it is refused, changing nothing.
//
//   - Resume now: one completer round for this key. If the outcome is
//     learned the answer is kept; if not, the failure is counted.
//   - Settle as failed: for when the operator checked that nothing
//     happened outside. The key is completed with FailedAnswer (409, a
//     problem document saying an operator settled it as failed), which
//     the client's retry gets.
//   - Settle with an answer: for when the operator learned the outcome
//     elsewhere: the status, content type and body they give (a JSON type
//     must parse), marked with the SettledHeader header.
//
// A settle takes the key over before completing it: a resume or a retry
// finishing the key at the same moment either refuses it (409, saying so;
// nothing changed) or finds the key settled. Each action taken is kept in
// the key's history: who, when, what, why, and what came of it.
//
// A settle and its entry are one: where the history is kept in the key
// store's database (a KeyHistory whose AddKeyEvent writes in the
// transaction its context carries, as the lab's on SQLite and PostgreSQL
// does), the entry is written in the transaction that completes the key,
// so that a crash leaves both or neither (SettleAndRecord,
// keyed.Completer.SettleRecorded). On a store that shares no transaction
// with the history (Redis, memory), an entry saying the settle is under
// way is written before the key is completed and one with its result
// after: a crash between them leaves an entry saying the result is
// unknown, never a settled key without one. A history that cannot be
// written leaves the key unsettled.
//
// A resume that finishes the key is recorded the same way
// (ResumeAndRecord, keyed.Completer.ResumeRecorded): the answer it keeps
// and its entry commit in one transaction, or, on a store without one,
// the entry saying the resume is under way comes first. A resume that
// finds nothing was done outside releases the key, which no store's
// transaction shares: its entry saying so is written before the release,
// and its result after, on every store. A history that cannot be written
// leaves the key in flight at its point, as it was (what the resume found
// or did outside stands for the next one). A resume whose Resume fails
// writes no answer: the key stays in flight at its point, held under the
// lease the resume took until it ends (keyed.Completer.LetGo gives it back
// sooner), and the failure is recorded after it ("failed: ..."). A resume
// whose last write to the store got no answer (keyed.ErrResultUnknown)
// may have finished the key all the same: it is recorded as "result
// unknown (resume): ...", never as failed, and the key's page says so
// beside the key's state. The key's page shows the latest entries of its
// history, newest first, with a link to older ones (KeyHistory.KeyEvents
// reads a page at a time).
//
// # Actions on dead letters
//
// Every action names its operator as the actor in the letter's history,
// with the reason given; nothing is ever deleted.
//
//   - Re-drive, as it is (reason optional).
//   - Edit and re-drive: the payload in a text area; unless the message's
//     Content-Type names another type, the edit must parse as one JSON
//     value (EditedPayload), and one that does not is refused with the
//     parser's message and position, changing nothing. The letter keeps
//     its original payload; the re-driven message carries the edit.
//   - Discard, with a reason (required: refused without one).
//   - Bulk re-drive or discard of every dead letter a filter selects: a
//     preview first, a dry run that lists exactly which letters (oldest
//     failure first, at most Config.MaxBulk) and how many parked messages
//     each releases; confirming posts those letters' IDs and takes them
//     and no others. If one of them changed meanwhile, nothing is done.
//
// Two operators acting on one letter (two tabs): the second is refused
// with 409, saying who acted first, when and why. An unknown letter is a
// 404.
//
// # Who may use it
//
// Operators (Config.Operators) are configured apart from the service's API
// keys: tenants never reach the console. An operator sends
// "Authorization: Bearer TOKEN", or logs in through the form, which sets
// an HttpOnly, SameSite=Strict session cookie (Secure over TLS, or when
// Config.PublicHTTPS says a proxy serves the console over https) holding a
// random session ID; sessions live in memory for Config.SessionTTL, so a
// restart logs everybody out, and logging out ends one. Tokens are
// compared by digest in constant time, against every operator. A request
// without a valid token or session gets 401 and the login form. After
// LoginFailures wrong tokens within LoginWindow from one address (by the
// form or as a bearer token; an IPv6 address counts by its /64), that
// address is answered 429 with Retry-After, even with a right token, until
// the window has passed; after LoginFailuresTotal wrong tokens within
// LoginWindow from all addresses together, every login by token is, so
// that guesses spread over many addresses are bounded too (a wrong token
// names no operator: the total is what bounds the guesses at each
// operator's token). Sessions already open go on meanwhile. A
// login leads back only to a path of the console: its next parameter is
// parsed, and anything a browser could read as another site leads to the
// console's home.
//
// Every state-changing request, the login's included, passes Go's
// http.CrossOriginProtection: a browser's cross-site POST is refused with
// 403, whatever cookies it carries. Pages forbid framing, scripts and
// caching (Content-Security-Policy, X-Frame-Options, Cache-Control:
// no-store). The log (Config.Logger) records who did what to which letter,
// never a token, a session ID, a payload or a reason.
package console
