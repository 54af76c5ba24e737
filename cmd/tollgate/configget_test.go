package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stdoutOf runs f and returns what it printed to os.Stdout.
func stdoutOf(t *testing.T, f func() error) (string, error) {
	t.Helper()
	return outputOf(t, &os.Stdout, f)
}

// outputOf runs f with *file a pipe and returns what f wrote to it.
func outputOf(t *testing.T, file **os.File, f func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := *file
	*file = w
	defer func() { *file = saved }()
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	ferr := f()
	w.Close()
	return <-done, ferr
}

// TestConfigGetArguments: "config get -config gateway.yaml server.listen"
// said "one config file at most, got 2 arguments", and "config get -h"
// said "no setting -h"; the config file is FILE or -config FILE on either
// side of the setting, as the other commands take it.
func TestConfigGetArguments(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := "server:\n  listen: 127.0.0.1:30150\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n  - id: m1\n    context_length: 100\n    max_output_length: 10\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"get", "server.listen", path},
		{"get", "server.listen", "-config", path},
		{"get", "-config", path, "server.listen"},
		{"get", "--config=" + path, "server.listen"},
		{"get", "server.listen", "-config=" + path},
	} {
		out, err := stdoutOf(t, func() error { return runConfig(args) })
		if err != nil || out != "127.0.0.1:30150\n" {
			t.Errorf("config %q: printed %q, %v; want 127.0.0.1:30150", args, out, err)
		}
	}
	if out, err := stdoutOf(t, func() error { return runConfig([]string{"get", "models.0.id", "-config", path}) }); err != nil || out != "m1\n" {
		t.Errorf("config get models.0.id: printed %q, %v; want m1", out, err)
	}
	for _, args := range [][]string{{"get", "-h"}, {"get", "server.listen", "--help"}} {
		out, err := stdoutOf(t, func() error { return runConfig(args) })
		if err != nil || !strings.HasPrefix(out, "usage: tollgate config get SETTING") {
			t.Errorf("config %q: printed %q, %v; want the usage", args, out, err)
		}
	}
	// config check -h answered with an error about the file argument.
	for _, args := range [][]string{{"check", "-h"}, {"check", path, "--help"}} {
		out, err := stdoutOf(t, func() error { return runConfig(args) })
		if err != nil || !strings.HasPrefix(out, "usage: tollgate config check") {
			t.Errorf("config %q: printed %q, %v; want the usage", args, out, err)
		}
	}
	for wantErr, args := range map[string][]string{
		"one config file at most": {"get", "server.listen", path, "-config", path},
		"needs a file name":       {"get", "server.listen", "-config"},
		"unknown flag -port":      {"get", "server.listen", "-port", "1"},
		"usage: tollgate config":  {"get"},
	} {
		if _, err := stdoutOf(t, func() error { return runConfig(args) }); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("config %q: got %v, want %q", args, err, wantErr)
		}
	}
}

// TestCommandsThatDoNotConnectLeaveTheNATSFilesUnread: the NATS
// credentials and TLS files are often readable only by the user serve
// runs as. Read by every load, they stopped config get, the admin CLI,
// finance and migrate for an operator allowed to read gateway.yaml;
// config check, which speaks for serve, still reads them.
func TestCommandsThatDoNotConnectLeaveTheNATSFilesUnread(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	yaml := "server:\n  listen: 127.0.0.1:30150\nnats:\n  url: nats://127.0.0.1:4222\n  creds_file: " + filepath.Join(dir, "unreadable.creds") +
		"\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n  - id: m1\n    context_length: 100\n    max_output_length: 10\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := stdoutOf(t, func() error { return runConfig([]string{"get", "server.listen", path}) }); err != nil || out != "127.0.0.1:30150\n" {
		t.Errorf("config get: printed %q, %v; want 127.0.0.1:30150", out, err)
	}
	if _, err := stdoutOf(t, func() error { return runConfig([]string{"check", path}) }); err == nil || !strings.Contains(err.Error(), "nats.creds_file") {
		t.Errorf("config check: %v; want the creds file refused", err)
	}
}
