// Command tollgate is the gateway's one binary.
//
//	tollgate serve                 run the gateway: the public API, the web
//	                               console, the admin API, a batch worker, and the
//	                               billing consumer when clickhouse.consume_in_serve
//	tollgate billing               run the billing consumer alone (JetStream -> ClickHouse, debits)
//	tollgate worker                run batch jobs alone, beside the gateways (storage.backend s3)
//	tollgate batch reindex [FILE]  have every account's next GET /v1/batch rebuild its index of newest jobs
//	tollgate migrate               apply the ClickHouse migrations of billing/schema
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
	"strings"
)

const usage = `usage: tollgate <command> [flags]

commands:
  serve                  run the gateway (reads $TOLLGATE_CONFIG, default ./gateway.yaml)
  billing                run the billing consumer (JetStream -> ClickHouse)
  worker                 run batch jobs only (storage.backend s3), beside the gateways
  batch reindex [FILE]   have every account's next GET /v1/batch rebuild its index of
                         newest jobs from its job records (once every gateway runs this
                         release, and after a rollback); needs the gateways' NATS
  migrate                apply ClickHouse migrations
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
	args := os.Args[1:]
	if len(args) == 0 {
		// No command is not "serve": run by mistake where it was meant to
		// print help, it made ./data, took the default ports and, on a
		// fresh directory, printed a demo key no one asked for.
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := args[0], args[1:]
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") &&
		cmd != "finance" && cmd != "version" {
		// Every other command reads its first argument as a config file
		// or a subcommand: "worker --help" tried to load a file named --help.
		fmt.Print(usage)
		return
	}
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
		fmt.Println("tollgate", version())
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "tollgate: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tollgate:", err)
		os.Exit(1)
	}
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
			return "", errors.New("the config file is FILE or -config FILE (default $TOLLGATE_CONFIG, else ./gateway.yaml)")
		case flag != "config":
			return "", fmt.Errorf("unknown flag %s: give the config file as FILE or -config FILE (default $TOLLGATE_CONFIG, else ./gateway.yaml)", args[0])
		case hasValue && value == "":
			return "", fmt.Errorf("%s names no file", args[0])
		case hasValue:
			args = append([]string{value}, args[1:]...)
		case len(args) < 2:
			return "", fmt.Errorf("%s needs a file name", args[0])
		default:
			args = args[1:]
		}
	}
	if len(args) > 1 {
		return "", fmt.Errorf("one config file at most, got %d arguments: %s", len(args), strings.Join(args, " "))
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
