package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// make run and finance agree on the ClickHouse that holds the bills. A
// second config with its own data_dir and the first one's clickhouse.dsn:
// make run checked CLICKHOUSE_DSN alone, started a ClickHouse of its own
// and billed there, while finance queried the config's (the other
// gateway's data). scripts/run.sh runs here with stubs for the binary and
// the ClickHouse script; each case checks where the gateway bills against
// where finance looks.
func TestMakeRunBillsWhereFinanceLooks(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("scripts/run.sh, which make run runs, needs bash")
	}
	script, err := os.ReadFile("../../scripts/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	const startedDSN = "clickhouse://127.0.0.1:29120/default" // what the stub's start writes to env
	for _, c := range []struct{ configDSN, wantBilled string }{
		{config.DefaultClickHouseDSN, startedDSN},
		{"clickhouse://127.0.0.1:29121/default", "clickhouse://127.0.0.1:29121/default"},
	} {
		root := t.TempDir()
		data := filepath.Join(root, "data")
		write := func(name, text string) {
			p := filepath.Join(root, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(text), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		write("scripts/run.sh", string(script))
		write("scripts/vectors.sh", "#!/bin/sh\nexit 0\n")
		write("scripts/clickhouse.sh", "#!/bin/sh\ncase $1 in start) mkdir -p \"$2\"; echo CLICKHOUSE_DSN="+startedDSN+" >\"$2/env\";; esac\n")
		// The stub gateway: config get as the config says (its dsn written
		// ${CLICKHOUSE_DSN:-...}, as gateway.yaml's), serve prints the DSN
		// it would bill into.
		write("bin/tollgate", "#!/bin/sh\ncase \"$1 $2 $3\" in\n"+
			"\"config get server.data_dir\") echo "+data+";;\n"+
			"\"config get clickhouse.dsn\") echo \"${CLICKHOUSE_DSN:-"+c.configDSN+"}\";;\n"+
			"serve*) echo \"billing into ${CLICKHOUSE_DSN:-"+c.configDSN+"}\";;\nesac\n")
		cmd := exec.Command("bash", filepath.Join(root, "scripts/run.sh"))
		cmd.Env = append(os.Environ(), "CLICKHOUSE_DSN=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("run.sh: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "billing into "+c.wantBilled+"\n") {
			t.Errorf("config dsn %s: make run printed\n%s\nwant billing into %s", c.configDSN, out, c.wantBilled)
		}
		cfg := &config.Config{Server: config.Server{DataDir: data}, ClickHouse: config.ClickHouse{DSN: c.configDSN}}
		t.Setenv("CLICKHOUSE_DSN", "")
		if got, _ := localClickHouseDSN(cfg); got != c.wantBilled {
			t.Errorf("config dsn %s: finance queries %s, make run bills into %s", c.configDSN, got, c.wantBilled)
		}
	}
}
