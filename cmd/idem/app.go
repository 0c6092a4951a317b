package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// app is one invocation of the command line: where it writes and where it
// reads the environment, so tests can give it their own.
type app struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)

	// started is set once a command's own code runs: an error before that
	// came from parsing the command line, and is a usage error.
	started bool
}

// usageError marks an error as the caller's misuse of the command line.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// silentError is a failure whose explanation the command already printed;
// run adds nothing but the exit status.
type silentError struct{ err error }

func (e *silentError) Error() string { return e.err.Error() }
func (e *silentError) Unwrap() error { return e.err }

// statusError is a failure the command already explained, with an exit
// status of its own (the probe's "could not run" is 2 without being a
// usage error).
type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var usage *usageError
	if !a.started || errors.As(err, &usage) {
		fmt.Fprintf(a.stderr, "idem: %s\n", usageMessage(err))
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	var status *statusError
	if errors.As(err, &status) {
		return status.code
	}
	var silent *silentError
	if !errors.As(err, &silent) {
		fmt.Fprintf(a.stderr, "idem: %s\n", oneLine(err.Error()))
	}
	return exitFailure
}

// usageMessage puts cobra's multi-line "unknown command" suggestions on one
// line.
func usageMessage(err error) string {
	msg := strings.TrimSpace(err.Error())
	head, suggestions, ok := strings.Cut(msg, "\n\nDid you mean this?\n")
	if !ok {
		return oneLine(msg)
	}
	var names []string
	for _, s := range strings.Fields(suggestions) {
		names = append(names, fmt.Sprintf("%q", s))
	}
	return fmt.Sprintf("%s (did you mean %s?)", oneLine(head), strings.Join(names, " or "))
}

// oneLine joins a message's lines, so every error is one line on stderr.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// action wraps a command's code so that run can tell its errors from the
// command line's.
func (a *app) action(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.started = true
		return fn(cmd, args)
	}
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Effectively-once payments: idempotency keys and their lab",
		Long: `idem runs the reference payment service, whose POSTs are made idempotent with
Idempotency-Key, and the lab that shows why that matters.

Start with 'idem demo': it needs no flags and no setup.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.AddCommand(a.serveCmd(), a.acquirerCmd(), a.reconcileCmd(), a.demoCmd(), a.migrateCmd(), a.keysCmd(), a.dlqCmd(), a.consoleCmd(), a.benchCmd(), a.tortureCmd(), a.probeCmd(), a.versionCmd())
	return root
}
