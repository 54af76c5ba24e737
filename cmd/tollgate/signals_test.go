//go:build unix

package main

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// TestBrokenStderrDoesNotKill: `make run | tee log`, Ctrl-C: tee died
// first, and the gateway's next log line on the closed pipe killed it by
// SIGPIPE before it could shut down. The helper process writes to a
// stderr whose reader is gone, and must live to exit by itself.
func TestBrokenStderrDoesNotKill(t *testing.T) {
	if os.Getenv("TOLLGATE_TEST_BROKEN_PIPE") == "1" {
		ignoreBrokenPipe()
		for range 3 {
			fmt.Fprintln(os.Stderr, "a log line to nobody")
		}
		os.Exit(0)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStderrDoesNotKill$")
	cmd.Env = append(os.Environ(), "TOLLGATE_TEST_BROKEN_PIPE=1")
	cmd.Stderr = w
	err = cmd.Run()
	w.Close()
	if err != nil {
		t.Fatalf("a write to a closed stderr: %v, want a clean exit", err)
	}
}
