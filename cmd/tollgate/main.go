// Command tollgate is the gateway's one binary.
//
//	tollgate serve [FILE]          run the gateway: the public API, the web
//	                               console, the admin API, a batch worker, and the
//	                               billing consumer when clickhouse.consume_in_serve
//	tollgate billing [FILE]        run the billing consumer alone (JetStream -> ClickHouse, debits)
//	tollgate worker [FILE]         run batch jobs alone, beside the gateways (storage.backend s3)
//	tollgate batch reindex [FILE]  have every account's next GET /v1/batch rebuild its index of newest jobs
//	tollgate migrate [FILE]        apply the ClickHouse migrations of billing/schema
//	tollgate finance [QUERY k=v…]  run a finance query of billing/schema/queries.sql
//	tollgate config check [FILE]   validate gateway.yaml, printing every error with its line
//	tollgate config get SETTING [FILE]   print one setting as the file reads after loading (server.data_dir)
//	tollgate accounts …            manage accounts through the admin API;
//	                               `accounts login ID` prints a one-time console link
//	tollgate keys …                manage API keys through the admin API
//	tollgate version
//
// The commands live in serve.go, billing.go (billing, migrate), worker.go
// (worker, batch),
// finance.go and admincli.go (accounts, keys, config check and get); the packages
// they start are in the README's layout table.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
)

const usage = `usage: tollgate <command> [flags]

commands (FILE, or -config FILE, is the config file: default
$TOLLGATE_CONFIG, else ./gateway.yaml; COMMAND -h prints a command's usage):
  serve [FILE]           run the gateway
  billing [FILE]         run the billing consumer (JetStream -> ClickHouse)
  worker [FILE]          run batch jobs only (storage.backend s3), beside the gateways
  batch reindex [FILE]   have every account's next GET /v1/batch rebuild its index of
                         newest jobs from its job records (once every gateway runs this
                         release, and after a rollback); needs the gateways' NATS
  migrate [FILE]         apply ClickHouse migrations
  finance [QUERY k=v...] run a finance query of billing/schema/queries.sql (no QUERY, or help: list them)
  config check [FILE]    validate a config file; prints every error with file:line:col
  config get SETTING [FILE]  print one setting as the file reads after loading
                         (variables expanded, config defaults filled in; not
                         values serve derives at run time), e.g. server.data_dir,
                         models.0.id, classifiers.NAME.mode; -h for more
` + accountsCommands + `
` + keysCommands + `
  version                print the version

accounts and keys call the admin API of a running gateway: -url (default
gateway.yaml's server.listen) and -token (default $TOLLGATE_ADMIN_TOKEN,
else <data_dir>/admin.token).
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// run runs the command line args and returns the exit code: 0, 1 for a
// command that failed, 2 for a command line it cannot read (an unknown
// command, subcommand, flag or argument, as the flag package exits).
func run(args []string) int {
	if len(args) == 0 {
		// No command is not "serve": run by mistake where it was meant to
		// print help, it made ./data, took the default ports and, on a
		// fresh directory, printed a demo key no one asked for.
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	var err error
	switch cmd {
	case "serve":
		err = runServe(args)
	case "worker":
		err = runWorker(args)
	case "batch":
		err = runBatch(args)
	case "billing":
		err = runBilling(args)
	case "migrate":
		err = runMigrate(args)
	case "finance":
		err = runFinance(args)
	case "config":
		err = runConfig(args)
	case "accounts":
		err = runAccounts(args)
	case "keys":
		err = runKeys(args)
	case "version", "-version", "--version":
		switch {
		case len(args) == 0:
			fmt.Println("tollgate", version())
		case asksHelp(args):
			fmt.Println("usage: tollgate version\n\nPrints the version of this binary.")
		default:
			// It printed the version and exited 0.
			err = usageErrorf("version takes no arguments: %q", args[0])
		}
	case "help", "-h", "--help":
		if len(args) == 0 || asksHelp(args[:1]) || args[0] == "help" {
			// "help -h" and "help help" asked run for "help -h" again:
			// it called itself until the stack overflowed.
			fmt.Print(usage)
			return 0
		}
		// "help serve" is "serve -h", "help accounts credit" is
		// "accounts credit -h".
		return run(append(slices.Clone(args), "-h"))
	default:
		fmt.Fprintf(os.Stderr, "tollgate: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return 0
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "tollgate:", err)
		return 2
	default:
		fmt.Fprintln(os.Stderr, "tollgate:", err)
		return 1
	}
}

// usageError is a command line a command cannot read; run exits 2 on it.
type usageError struct{ error }

func usageErrorf(format string, a ...any) error {
	return usageError{fmt.Errorf(format, a...)}
}

// isHelp says whether arg asks for a command's help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

// asksHelp says whether a command's args ask for its help: "help" first,
// or a help flag anywhere.
func asksHelp(args []string) bool {
	return len(args) > 0 && args[0] == "help" || slices.ContainsFunc(args, isHelp)
}

// Usage of the commands whose one argument is the config file.
const (
	serveUsage = `usage: tollgate serve [FILE | -config FILE]

Runs the gateway: the public API, the web console, the admin API, a batch
worker, and the billing consumer when clickhouse.consume_in_serve is true.
FILE is the config file (default $TOLLGATE_CONFIG, else ./gateway.yaml).
`
	billingUsage = `usage: tollgate billing [FILE | -config FILE]

Runs the billing consumer alone (JetStream -> ClickHouse, debits), for
gateways with clickhouse.consume_in_serve false. FILE is the config file
(default $TOLLGATE_CONFIG, else ./gateway.yaml).
`
	workerUsage = `usage: tollgate worker [FILE | -config FILE]

Runs batch jobs alone, beside the gateways; needs storage.backend s3.
FILE is the config file (default $TOLLGATE_CONFIG, else ./gateway.yaml).
`
	migrateUsage = `usage: tollgate migrate [FILE | -config FILE]

Applies the ClickHouse migrations of billing/schema to clickhouse.dsn.
FILE is the config file (default $TOLLGATE_CONFIG, else ./gateway.yaml).
`
	batchUsage = `usage: tollgate batch reindex [FILE | -config FILE]

Has every account's next GET /v1/batch rebuild its index of newest jobs
from its job records: once every gateway runs this release, and after a
rollback. Connects to the gateways' NATS (nats.url, else the embedded one
of a running tollgate serve). FILE is the config file (default
$TOLLGATE_CONFIG, else ./gateway.yaml).
`
)

// commandConfigArg is configArg for a command whose one argument is the
// config file, with usage its usage: -h, -help or --help prints it and
// returns errHelpShown. The global usage printed for "serve -h" never
// said the command takes FILE or -config FILE, and "batch reindex -h"
// answered with an error.
func commandConfigArg(usage string, args []string) (string, error) {
	if asksHelp(args) {
		fmt.Print(usage)
		return "", errHelpShown
	}
	return configArg(args)
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// configArg is the config file a command that takes one names: FILE,
// -config FILE or -config=FILE (two dashes as well), else configPath's
// default. Any other flag is an error: "serve -config x.yaml" once looked
// for a file named -config.
func configArg(args []string) (string, error) {
	if len(args) > 0 && strings.HasPrefix(args[0], "-") {
		flag, value, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		switch {
		case flag == "h" || flag == "help":
			return "", usageErrorf("the config file is FILE or -config FILE (default $TOLLGATE_CONFIG, else ./gateway.yaml)")
		case flag != "config":
			return "", usageErrorf("unknown flag %s: give the config file as FILE or -config FILE (default $TOLLGATE_CONFIG, else ./gateway.yaml)", args[0])
		case hasValue && value == "":
			return "", usageErrorf("%s names no file", args[0])
		case hasValue:
			args = append([]string{value}, args[1:]...)
		case len(args) < 2:
			return "", usageErrorf("%s needs a file name", args[0])
		default:
			args = args[1:]
		}
	}
	if len(args) > 1 {
		return "", usageErrorf("one config file at most, got %d arguments: %s", len(args), strings.Join(args, " "))
	}
	return configPath(args), nil
}

func configPath(args []string) string {
	if len(args) > 0 && args[0] != "" {
		return args[0]
	}
	if p := os.Getenv("TOLLGATE_CONFIG"); p != "" {
		return p
	}
	return "gateway.yaml"
}
