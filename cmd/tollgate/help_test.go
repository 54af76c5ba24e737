package main

import (
	"strings"
	"testing"
)

// runOf runs the command line args as main does and returns its exit
// code and what it printed on stdout and stderr.
func runOf(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	stderr, _ = stderrOf(t, func() error {
		stdout, _ = stdoutOf(t, func() error {
			code = run(args)
			return nil
		})
		return nil
	})
	return code, stdout, stderr
}

// Every command's -h prints that command's usage and exits 0, and an
// unknown subcommand or argument is named and exits 2, as an unknown
// command is (found by a new user following the README): "serve -h"
// printed the global usage, which never says serve takes FILE or -config
// FILE; "batch reindex -h" failed with "the config file is FILE or
// -config FILE"; "version --bogus" printed the version and exited 0; and
// "accounts bogus" printed the usage without a word of what was wrong.
func TestEveryCommandsHelpAndUnknownArguments(t *testing.T) {
	t.Chdir(t.TempDir())
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Setenv("TOLLGATE_LISTEN", "")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "")
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string // what stdout holds, when the exit code is 0
		stderr string // what stderr holds, when it is not
	}{
		{[]string{"serve", "-h"}, 0, "usage: tollgate serve [FILE | -config FILE]", ""},
		{[]string{"serve", "-config", "x.yaml", "--help"}, 0, "usage: tollgate serve [FILE | -config FILE]", ""},
		{[]string{"billing", "-h"}, 0, "usage: tollgate billing [FILE | -config FILE]", ""},
		{[]string{"worker", "--help"}, 0, "usage: tollgate worker [FILE | -config FILE]", ""},
		{[]string{"migrate", "-help"}, 0, "usage: tollgate migrate [FILE | -config FILE]", ""},
		{[]string{"batch", "reindex", "-h"}, 0, "usage: tollgate batch reindex [FILE | -config FILE]", ""},
		{[]string{"batch", "-h"}, 0, "usage: tollgate batch reindex [FILE | -config FILE]", ""},
		{[]string{"version", "-h"}, 0, "usage: tollgate version", ""},
		{[]string{"accounts", "-h"}, 0, "usage: tollgate accounts SUBCOMMAND, one of:\n  accounts create ID", ""},
		{[]string{"keys", "--help"}, 0, "usage: tollgate keys SUBCOMMAND, one of:\n  keys create ACCOUNT", ""},
		{[]string{"accounts", "credit", "-h"}, 0, "usage: tollgate accounts credit ID USD [-idempotency-key KEY]   a negative USD", ""},
		{[]string{"keys", "revoke", "-h"}, 0, "usage: tollgate keys revoke KEY_ID\n", ""},
		{[]string{"help", "serve"}, 0, "usage: tollgate serve [FILE | -config FILE]", ""},
		{[]string{"-h"}, 0, "usage: tollgate <command> [flags]", ""},
		// "help -h" and "help help" called run for "help -h" again and
		// again, until the stack overflowed (1 GB, exit 2).
		{[]string{"help", "-h"}, 0, "usage: tollgate <command> [flags]", ""},
		{[]string{"help", "help"}, 0, "usage: tollgate <command> [flags]", ""},
		{[]string{"help", "accounts", "credit"}, 0, "usage: tollgate accounts credit ID USD", ""},
		{[]string{"help", "config", "get"}, 0, "usage: tollgate config get SETTING", ""},
		{[]string{"config", "-h"}, 0, "usage: tollgate config check [FILE]", ""},
		{[]string{"config", "bogus"}, 2, "", `tollgate: unknown config subcommand "bogus"`},
		{[]string{"config"}, 2, "", "tollgate: usage: tollgate config check"},
		{[]string{"config", "get", "--bogus"}, 2, "", "tollgate: unknown flag --bogus"},
		{[]string{"config", "get"}, 2, "", "tollgate: config get needs the setting to print"},

		{[]string{"bogus"}, 2, "", `tollgate: unknown command "bogus"`},
		{[]string{"version", "--bogus"}, 2, "", `tollgate: version takes no arguments: "--bogus"`},
		{[]string{"accounts", "bogus"}, 2, "", `tollgate: unknown accounts subcommand "bogus"` + "\n\nusage: tollgate accounts SUBCOMMAND"},
		{[]string{"accounts"}, 2, "", "tollgate: accounts needs a subcommand\n\nusage: tollgate accounts SUBCOMMAND"},
		{[]string{"keys", "bogus"}, 2, "", `tollgate: unknown keys subcommand "bogus"` + "\n\nusage: tollgate keys SUBCOMMAND"},
		{[]string{"batch", "bogus"}, 2, "", `tollgate: unknown batch subcommand "bogus"` + "\n\nusage: tollgate batch reindex"},
		{[]string{"serve", "--port", "1"}, 2, "", "tollgate: unknown flag --port"},
		{[]string{"billing", "a.yaml", "b.yaml"}, 2, "", "tollgate: one config file at most"},
		{[]string{"accounts", "get"}, 2, "", "tollgate: accounts get: ID is missing"},
		{[]string{"accounts", "get", "acme", "-bogus"}, 2, "", "tollgate: accounts get does not take -bogus"},
		{[]string{"keys", "revoke", "a", "b"}, 2, "", `tollgate: keys revoke: unexpected argument "b"`},
		{[]string{"help", "bogus"}, 2, "", `tollgate: unknown command "bogus"`},
		{[]string{"finance", "bogus"}, 2, "", `tollgate: no finance query "bogus"`},
		{[]string{"finance", "invoice", "month"}, 2, "", `tollgate: parameter "month": write name=value`},
	} {
		code, stdout, stderr := runOf(t, tc.args...)
		if code != tc.code || tc.code == 0 && (!strings.Contains(stdout, tc.stdout) || stderr != "") ||
			tc.code != 0 && (!strings.Contains(stderr, tc.stderr) || stdout != "") {
			t.Errorf("tollgate %s: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit %d, stdout holding %q, stderr %q",
				strings.Join(tc.args, " "), code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
		}
	}
}
