package config

import (
	"os"
	"reflect"
	"testing"
	"time"
)

// TestBatchRestartOnly: only max_jobs (the worker pool size) needs a
// restart; the rest is read by each job run, and the count caps by each
// create.
func TestBatchRestartOnly(t *testing.T) {
	data, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	old, err := parse("gateway.yaml", data, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	reloadable, _ := parse("gateway.yaml", data, noEnv)
	reloadable.Batch.PricePerToken = "0.0000001"
	reloadable.Batch.Concurrency = 7
	reloadable.Batch.CheckpointLines = 9
	reloadable.Batch.MaxPendingJobs = 3
	reloadable.Batch.MaxJobsCreatedPerHour = 4
	reloadable.Batch.JobRetention = 48 * time.Hour
	reloadable.Auth.MaxKeysPerAccount = 5
	reloadable.Auth.MaxKeysCreatedPerHour = 7
	if diff := reloadable.RestartOnlyDiff(old); diff != nil {
		t.Errorf("reloadable batch changes reported as restart-only: %v", diff)
	}
	changed, _ := parse("gateway.yaml", data, noEnv)
	changed.Batch.MaxJobs = old.Batch.MaxJobs + 1
	if diff := changed.RestartOnlyDiff(old); !reflect.DeepEqual(diff, []string{"batch.max_jobs"}) {
		t.Errorf("RestartOnlyDiff = %v, want [batch.max_jobs]", diff)
	}
}
