//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/miniotest"
	"github.com/tollgate/tollgate/internal/testutil"
)

// TestServeStartsWhileTheS3StoreIsDown: with storage.backend s3, a
// gateway started while the object store did not answer exited after
// about 3 s (`opening object storage: … connection refused`), so a
// restart during an S3 outage took chat, models and admin down with
// batch. It must start, answer /v1/batch 503 batch_unavailable, and run
// batch jobs within seconds of the store's return, making the bucket;
// the creates refused meanwhile do not count as jobs created.
func TestServeStartsWhileTheS3StoreIsDown(t *testing.T) {
	minio := miniotest.Start(t)
	minio.Stop()
	dir := t.TempDir()
	// Named in the config (runServe reads a file): free ones, not fixed
	// ones another package's test may hold.
	listen, natsListen := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	api := "http://" + listen
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("server:\n  data_dir: "+dir+"\n  listen: "+listen+"\n  demo_credit_usd: \"0\"\n  admin_token: test-admin-token-0123\n"+
		"nats:\n  embedded_listen: "+natsListen+"\n"+
		"storage:\n  backend: s3\n  s3:\n    endpoint: "+minio.Endpoint()+"\n    bucket: tollgate\n    access_key: "+minio.AccessKey()+
		"\n    secret_key: "+minio.SecretKey()+"\n    create_bucket: true\n"+
		"plugins:\n  engine: lexical\n"+
		// A create refused for the outage must not count against it.
		"batch:\n  max_jobs_created_per_hour: 1\n"+
		"upstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n"+
		"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- runServe([]string{cfg}) }()
	stopped := false
	defer func() {
		if !stopped {
			_ = syscall.Kill(os.Getpid(), syscall.SIGTERM) // caught by runServe
			<-served
		}
	}()

	client := &http.Client{Timeout: 30 * time.Second}
	call := func(method, url, token, body string) (int, http.Header, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header, data
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-served:
			stopped = true
			t.Fatalf("serve with the object store down ended: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if resp, err := client.Get(api + "/v1/models"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("serve with the object store down does not answer after 30 s")
		}
	}
	if status, _, body := call("POST", api+"/admin/v1/accounts", "test-admin-token-0123", `{"id":"acme","credit_usd":"5"}`); status != http.StatusCreated {
		t.Fatalf("creating the account: %d %s", status, body)
	}
	status, _, body := call("POST", api+"/admin/v1/accounts/acme/keys", "test-admin-token-0123", `{"name":"k"}`)
	var made struct{ Key string }
	if err := json.Unmarshal(body, &made); status != http.StatusCreated || err != nil || made.Key == "" {
		t.Fatalf("creating a key: %d %s", status, body)
	}
	if status, _, body := call("GET", api+"/v1/models", made.Key, ""); status != http.StatusOK || !strings.Contains(string(body), `"m"`) {
		t.Fatalf("/v1/models with the object store down: %d %s", status, body)
	}
	const job = `{"labels": ["billing", "bug"]}`
	if status, _, body := call("POST", api+"/v1/batch", made.Key, job); status != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"batch_unavailable"`) {
		t.Fatalf("POST /v1/batch with the object store down: %d %s, want 503 batch_unavailable", status, body)
	}

	minio.Restart()
	back := time.Now()
	var created struct {
		JobID        string            `json:"job_id"`
		UploadURL    string            `json:"upload_url"`
		UploadFields map[string]string `json:"upload_fields"`
	}
	testutil.CheckFor(t, 10*time.Second, 200*time.Millisecond, func() error {
		status, _, body := call("POST", api+"/v1/batch", made.Key, job)
		if status != http.StatusCreated {
			return fmt.Errorf("POST /v1/batch after the object store came back: %d %s", status, body)
		}
		return json.Unmarshal(body, &created)
	})
	t.Logf("batch jobs are created %s after the store came back", time.Since(back).Round(time.Millisecond))
	if status, msg := testutil.PostForm(t, created.UploadURL, created.UploadFields, []byte(`{"text": "I was charged twice"}`+"\n")); status/100 != 2 {
		t.Fatalf("upload: %d %s", status, msg)
	}
	if status, _, body := call("POST", api+"/v1/batch/"+created.JobID+"/start", made.Key, ""); status != http.StatusAccepted {
		t.Fatalf("start: %d %s", status, body)
	}
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		_, _, body := call("GET", api+"/v1/batch/"+created.JobID, made.Key, "")
		if !strings.Contains(string(body), `"status":"completed"`) {
			return fmt.Errorf("job: %s", body)
		}
		return nil
	})

	stopped = true
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("serve ended with %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("serve still runs 40 s after SIGTERM")
	}
}
