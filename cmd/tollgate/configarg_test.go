package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigArg: the config file is FILE or -config FILE; "serve -config
// x.yaml" once looked for a file named -config, and any other flag was
// taken for a file name too.
func TestConfigArg(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	for _, c := range []struct {
		args []string
		want string // "" for an error
	}{
		{nil, "gateway.yaml"},
		{[]string{"x.yaml"}, "x.yaml"},
		{[]string{"-config", "x.yaml"}, "x.yaml"},
		{[]string{"--config", "x.yaml"}, "x.yaml"},
		{[]string{"-config=x.yaml"}, "x.yaml"},
		{[]string{"-config"}, ""},
		{[]string{"-config="}, ""},
		{[]string{"-h"}, ""},
		{[]string{"--port", "1"}, ""},
		{[]string{"a.yaml", "b.yaml"}, ""},
		{[]string{"-config", "a.yaml", "b.yaml"}, ""},
	} {
		got, err := configArg(c.args)
		if c.want == "" && err == nil || c.want != "" && (err != nil || got != c.want) {
			t.Errorf("configArg(%q) = %q, %v; want %q", c.args, got, err, c.want)
		}
	}
}

// "config check /nonexistent.yaml" said the file "is invalid: reading
// config: open …": a file that cannot be read is not one with mistakes.
func TestConfigFileThatCannotBeRead(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("server:\n  listen: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"check", missing}, missing + " cannot be read: open " + missing + ": no such file or directory"},
		{[]string{"get", "server.listen", missing}, missing + " cannot be read: open " + missing + ": no such file or directory"},
		{[]string{"check", dir}, dir + " cannot be read: read " + dir + ": is a directory"},
		{[]string{"check", bad}, bad + " is invalid:\n" + bad + ":2: did not find expected node content"},
	} {
		_, err := stdoutOf(t, func() error { return runConfig(c.args) })
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("config %q: %v\nwant %s", c.args, err, c.want)
		}
	}
}
