package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// TestCreationLogLimitsPerAccountAcrossProcesses: what an account made in
// the window counts on every process of the NATS, each account on its
// own; past the limit nothing is counted and the wait runs to when the
// oldest leaves the window, after which the account makes again.
func TestCreationLogLimitsPerAccountAcrossProcesses(t *testing.T) {
	ctx := testContext(t)
	b := startEmbeddedBroker(t, t.TempDir())
	defer b.Close()
	other, err := Start(ctx, config.NATS{URL: b.ClientURL()}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	const window = 2 * time.Second
	here, err := EnsureCreationLog(ctx, b.JetStream(), "TEST_CREATED", "test", "test.created.", 1, window)
	if err != nil {
		t.Fatal(err)
	}
	there, err := EnsureCreationLog(ctx, other.JetStream(), "TEST_CREATED", "test", "test.created.", 1, window)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i, log := range []*CreationLog{here, there, here} {
		made, wait, err := log.Take(ctx, "acme.corp", 3)
		if err != nil || wait != 0 || made != i+1 {
			t.Fatalf("creation %d: made %d, wait %s, %v; want %d made and no wait", i+1, made, wait, err, i+1)
		}
	}
	made, wait, err := there.Take(ctx, "acme.corp", 3)
	if err != nil || made != 3 || wait <= 0 || wait > window {
		t.Fatalf("a fourth creation under a limit of 3, through the other process: made %d, wait %s, %v; want 3 and a wait within %s", made, wait, err, window)
	}
	if made, wait, err := here.Take(ctx, "acme", 3); err != nil || wait != 0 || made != 1 {
		t.Fatalf("an account whose id starts the same: made %d, wait %s, %v", made, wait, err)
	}
	if made, wait, err := here.Take(ctx, "acme.corp", 0); err != nil || wait != 0 || made != 0 {
		t.Fatalf("no limit: made %d, wait %s, %v; want nothing counted", made, wait, err)
	}
	testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		if _, wait, err := here.Take(ctx, "acme.corp", 3); err != nil || wait != 0 {
			return errors.New("still refused")
		}
		return nil
	})
	if waited := time.Since(start); waited < window {
		t.Errorf("made again after %s, inside the %s window", waited, window)
	}
}

// TestCreationLogWaitsForEnoughToLeave: an account past its limit (lowered
// by a reload, or passed by racing creations) may make again once
// made-limit+1 creations have left the window, not the oldest alone: the
// wait said "in 2 seconds" and the retry then was refused for minutes.
func TestCreationLogWaitsForEnoughToLeave(t *testing.T) {
	ctx := testContext(t)
	b := startEmbeddedBroker(t, t.TempDir())
	defer b.Close()
	const window = 10 * time.Second
	log, err := EnsureCreationLog(ctx, b.JetStream(), "TEST_CREATED", "test", "test.created.", 1, window)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := log.Take(ctx, "acme", 5); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	for range 2 {
		if _, _, err := log.Take(ctx, "acme", 5); err != nil {
			t.Fatal(err)
		}
	}
	made, wait, err := log.Take(ctx, "acme", 1)
	if err != nil || made != 3 || wait < window-time.Second {
		t.Fatalf("3 made under a limit lowered to 1: made %d, wait %s, %v; want a wait until the newest leaves, over %s", made, wait, err, window-time.Second)
	}
}
