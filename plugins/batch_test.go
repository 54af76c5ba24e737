package plugins_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/miniotest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy/proxytest"
	"github.com/tollgate/tollgate/storage"
)

// batchHarness is a gateway with batch jobs: object storage (the local
// backend on its own listener, or MinIO through the s3 backend) and, when
// asked, a worker.
type batchHarness struct {
	*harness
	svc   *batch.Service
	minio *miniotest.Server // the s3 backend's
}

func newBatchHarness(t *testing.T, backend string, ho harnessOptions) *batchHarness {
	t.Helper()
	var store storage.Store
	var minio *miniotest.Server
	switch backend {
	case "local":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := storage.NewLocal(storage.LocalOptions{DataDir: t.TempDir(), PublicBaseURL: "http://" + ln.Addr().String(), Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = l.Serve(ln) }()
		t.Cleanup(func() { _ = l.Shutdown(context.Background()) })
		store = l
	case "s3":
		srv := miniotest.Start(t)
		minio = srv
		s3, err := storage.NewS3(t.Context(), storage.S3Options{Endpoint: srv.Endpoint(), Bucket: "tollgate-batch",
			AccessKey: srv.AccessKey(), SecretKey: srv.SecretKey(), CreateBucket: true})
		if err != nil {
			t.Fatal(err)
		}
		store = s3
	default:
		t.Fatalf("no backend %q", backend)
	}
	var svc *batch.Service
	ho.batch = func(g *gatewaytest.Gateway, rt batch.Runtime) (*batch.Service, error) {
		var err error
		svc, err = batch.Open(g.Ctx, g.Broker.JetStream(), store, batch.Options{Runtime: rt, Recorder: g.Recorder, Logf: t.Logf})
		return svc, err
	}
	h := newHarness(t, ho)
	return &batchHarness{harness: h, svc: svc, minio: minio}
}

// startWorker runs the gateway's batch worker until the test ends.
func (h *batchHarness) startWorker() {
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = h.svc.RunWorker(ctx) }()
	h.t.Cleanup(func() { cancel(); <-done })
}

// call sends method path with key (none when empty) and body.
func (h *batchHarness) call(method, path, key, body string) reply {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: data}
}

// object decodes a JSON object answer with the given status.
func (r reply) object(t *testing.T, status int) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %s", r.body)
	}
	return m
}

// created is the answer of POST /v1/batch.
type created struct {
	JobID           string            `json:"job_id"`
	UploadURL       string            `json:"upload_url"`
	UploadFields    map[string]string `json:"upload_fields"`
	InputKey        string            `json:"input_key"`
	UploadExpiresAt string            `json:"upload_expires_at"`
}

func (h *batchHarness) createJob(key, body string) created {
	h.t.Helper()
	r := h.call("POST", "/v1/batch", key, body)
	if r.status != http.StatusCreated {
		h.t.Fatalf("create: %s", r)
	}
	var c created
	if err := json.Unmarshal(r.body, &c); err != nil {
		h.t.Fatal(err)
	}
	return c
}

func (h *batchHarness) upload(c created, file []byte) {
	h.t.Helper()
	if status, msg := testutil.PostForm(h.t, c.UploadURL, c.UploadFields, file); status/100 != 2 {
		h.t.Fatalf("upload: %d %s", status, msg)
	}
}

// poll waits until the job is completed or failed, as spec 3.4's pollers
// do, and returns its last status.
func (h *batchHarness) poll(key, id string) map[string]any {
	h.t.Helper()
	var job map[string]any
	checkFor(h.t, 60*time.Second, 20*time.Millisecond, func() error {
		job = h.call("GET", "/v1/batch/"+id, key, "").object(h.t, 200)
		if s := job["status"]; s != "completed" && s != "failed" {
			return fmt.Errorf("job is %v: %v", s, job)
		}
		return nil
	})
	return job
}

func download(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

const batchInput = `{"text": "I was charged twice this month, please refund me"}
{"text": "The export button does nothing and the app crashes"}
not json
{"text": "How do I reset my password?"}
`

// TestBatchWalkthrough runs spec 4.3-4.9 as a client does with curl, on
// both storage backends: create, upload with the returned fields, start,
// poll, download, delete; and checks the bill.
func TestBatchWalkthrough(t *testing.T) {
	for _, backend := range []string{"local", "s3"} {
		t.Run(backend, func(t *testing.T) {
			h := newBatchHarness(t, backend, harnessOptions{})
			h.startWorker()
			c := h.createJob(h.key, `{"labels": ["billing", "bug", "account"], "descriptions": {"billing": "charges, refunds and invoices",
				"bug": "something is broken: crashes, errors, buttons that do nothing", "account": "sign-in and passwords"}}`)
			if c.JobID == "" || c.UploadURL == "" || c.InputKey == "" || c.UploadFields["key"] != c.InputKey ||
				c.UploadFields["policy"] == "" || c.UploadFields["x-amz-signature"] == "" {
				t.Fatalf("create answered %+v; want job_id, upload_url, and upload_fields with key (= input_key), policy and signature", c)
			}
			h.upload(c, []byte(batchInput))
			start := h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, http.StatusAccepted)
			if start["job_id"] != c.JobID || start["status"] != "processing" {
				t.Fatalf("start answered %v", start)
			}
			job := h.poll(h.key, c.JobID)
			for _, f := range []string{"job_id", "status", "requests_total", "requests_completed", "requests_failed",
				"estimated_tokens", "actual_tokens", "created_at", "started_at", "completed_at", "error"} {
				if _, ok := job[f]; !ok {
					t.Errorf("job lacks %s: %v", f, job)
				}
			}
			if job["status"] != "completed" || job["requests_total"] != 4.0 || job["requests_completed"] != 3.0 ||
				job["requests_failed"] != 1.0 || job["error"] != nil || job["actual_tokens"] == nil {
				t.Fatalf("job %v", job)
			}
			for _, f := range []string{"created_at", "started_at", "completed_at"} {
				if _, err := time.Parse(time.RFC3339, job[f].(string)); err != nil {
					t.Errorf("%s %q is not ISO 8601: %v", f, job[f], err)
				}
			}
			res := h.call("GET", "/v1/batch/"+c.JobID+"/results", h.key, "").object(t, 200)
			// Every time in UTC with milliseconds: expires_at had whole
			// seconds, unlike the job's times.
			for f, v := range map[string]any{"created_at": job["created_at"], "started_at": job["started_at"],
				"completed_at": job["completed_at"], "expires_at": res["expires_at"]} {
				if s, _ := v.(string); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(s) {
					t.Errorf("%s %v: want UTC with milliseconds, as 2026-11-21T06:27:58.718Z", f, v)
				}
			}
			status, data := download(t, res["download_url"].(string))
			if status != 200 {
				t.Fatalf("download: %d %s", status, data)
			}
			var lines []map[string]any
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				var m map[string]any
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					t.Fatalf("result line %q: %v", sc.Text(), err)
				}
				lines = append(lines, m)
			}
			if len(lines) != 4 || lines[0]["label"] != "billing" || lines[1]["label"] != "bug" || lines[3]["label"] != "account" ||
				lines[2]["error"] == nil || lines[0]["confidence"] == nil || lines[0]["tokens"] == nil {
				t.Fatalf("results:\n%s", data)
			}
			var tokens int64
			for i, l := range lines {
				if l["line"] != float64(i+1) {
					t.Fatalf("result %d is for line %v", i+1, l["line"])
				}
				if n, ok := l["tokens"].(float64); ok {
					tokens += int64(n)
				}
			}
			if job["actual_tokens"] != float64(tokens) {
				t.Fatalf("actual_tokens %v, the lines' tokens add up to %d", job["actual_tokens"], tokens)
			}
			evs := h.events(1)
			price, _ := money.ParsePrice("0.00000008")
			var cost money.Atto
			cost.Add(tokens, price)
			if ev := evs[0]; ev.JobID != c.JobID || ev.ID != c.JobID || ev.Endpoint != "/v1/batch" || ev.Account != "acme" ||
				ev.CostNanos != cost.Nanos() || ev.PromptTokens != tokens || ev.Model != "lexical" {
				t.Fatalf("event %+v; want job %s, %d tokens, %d nano-USD", ev, c.JobID, tokens, cost.Nanos())
			}

			list := h.call("GET", "/v1/batch", h.key, "")
			var items []map[string]any
			if err := json.Unmarshal(list.body, &items); err != nil || len(items) != 1 || items[0]["job_id"] != c.JobID || len(items[0]) != 5 {
				t.Fatalf("list: %s", list)
			}
			del := h.call("DELETE", "/v1/batch/"+c.JobID, h.key, "").object(t, 200)
			if del["job_id"] != c.JobID || del["deleted"] != true {
				t.Fatalf("delete answered %v", del)
			}
			h.call("GET", "/v1/batch/"+c.JobID, h.key, "").apiError(t, 404, "not_found")
			if status, _ := download(t, res["download_url"].(string)); status != 404 {
				t.Fatalf("download after delete: %d, want 404: the files go with the job", status)
			}
		})
	}
}

// TestBatchResultsExpireWhenTheAnswerSays: expires_at was the request's
// time plus storage.download_ttl, but the link's signature counts whole
// seconds (X-Amz-Date) and expired up to a second before: fetched 0.15 s
// before expires_at, MinIO refused it as expired.
func TestBatchResultsExpireWhenTheAnswerSays(t *testing.T) {
	for _, backend := range []string{"local", "s3"} {
		t.Run(backend, func(t *testing.T) {
			h := newBatchHarness(t, backend, harnessOptions{extra: "storage:\n  download_ttl: 3s"})
			h.startWorker()
			c := h.createJob(h.key, `{"classifier": "support-intent"}`)
			h.upload(c, []byte(batchInput))
			h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, http.StatusAccepted)
			if job := h.poll(h.key, c.JobID); job["status"] != "completed" {
				t.Fatalf("job %v", job)
			}
			var link string
			var expires time.Time
			for range 5 {
				res := h.call("GET", "/v1/batch/"+c.JobID+"/results", h.key, "").object(t, 200)
				link, _ = res["download_url"].(string)
				var err error
				if expires, err = time.Parse(time.RFC3339, fmt.Sprint(res["expires_at"])); err != nil {
					t.Fatalf("expires_at: %v", err)
				}
				if signed := testutil.PresignedExpiry(t, link); expires.After(signed) {
					t.Fatalf("expires_at %s is after the link's own expiry %s (X-Amz-Date + X-Amz-Expires)",
						res["expires_at"], signed.Format(time.RFC3339))
				}
				time.Sleep(170 * time.Millisecond) // another fraction of a second
			}
			time.Sleep(time.Until(expires.Add(-150 * time.Millisecond)))
			if status, data := download(t, link); status != 200 {
				t.Fatalf("download 150ms before expires_at: %d %s", status, data)
			}
		})
	}
}

func TestBatchMultiMode(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{})
	h.startWorker()
	c := h.createJob(h.key, `{"classifier": "support-intent", "mode": "multi", "threshold": 0.2}`)
	h.upload(c, []byte(batchInput))
	h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, 202)
	if job := h.poll(h.key, c.JobID); job["status"] != "completed" {
		t.Fatalf("job %v", job)
	}
	_, data := download(t, h.call("GET", "/v1/batch/"+c.JobID+"/results", h.key, "").object(t, 200)["download_url"].(string))
	first, _, _ := strings.Cut(string(data), "\n")
	var line struct {
		Line   int `json:"line"`
		Labels []struct {
			Label      string  `json:"label"`
			Confidence float64 `json:"confidence"`
		} `json:"labels"`
		Tokens int `json:"tokens"`
	}
	if err := json.Unmarshal([]byte(first), &line); err != nil || line.Line != 1 || len(line.Labels) == 0 || line.Labels[0].Label != "billing" || line.Tokens == 0 {
		t.Fatalf("multi-mode line %s", first)
	}
}

// TestBatchTie: a line whose text shares no word with any label carries
// "tie":true, as /v1/classify does; a line with evidence does not.
func TestBatchTie(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{})
	h.startWorker()
	c := h.createJob(h.key, `{"labels": ["bug", "billing"], "model": "lexical"}`)
	h.upload(c, []byte(`{"text": "The export button crashes"}`+"\n"+`{"text": "A billing question"}`+"\n"))
	h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, 202)
	if job := h.poll(h.key, c.JobID); job["status"] != "completed" {
		t.Fatalf("job %v", job)
	}
	_, data := download(t, h.call("GET", "/v1/batch/"+c.JobID+"/results", h.key, "").object(t, 200)["download_url"].(string))
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 {
		t.Fatalf("results:\n%s", data)
	}
	var tied, clear map[string]any
	if json.Unmarshal([]byte(lines[0]), &tied) != nil || json.Unmarshal([]byte(lines[1]), &clear) != nil {
		t.Fatalf("results:\n%s", data)
	}
	if tied["tie"] != true || tied["label"] != "billing" || tied["confidence"] != 0.5 {
		t.Errorf("line without evidence %s; want tie true, billing (first by name) at 0.5", lines[0])
	}
	if _, ok := clear["tie"]; ok || clear["label"] != "billing" {
		t.Errorf("line with evidence %s; want billing without tie", lines[1])
	}
}

// An empty input file is refused by the upload on both backends (the
// policy's content-length-range starts at 1, EntityTooSmall), and a start
// then says so: it said "has no input file yet: upload it first" to a
// client that had just uploaded one.
func TestEmptyInputUploadIsRefusedAndStartSaysSo(t *testing.T) {
	for _, backend := range []string{"local", "s3"} {
		t.Run(backend, func(t *testing.T) {
			h := newBatchHarness(t, backend, harnessOptions{})
			c := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
			if status, msg := testutil.PostForm(t, c.UploadURL, c.UploadFields, nil); status != 400 || !strings.Contains(msg, "EntityTooSmall") {
				t.Fatalf("empty upload: %d %s; want 400 EntityTooSmall", status, msg)
			}
			e := h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").apiError(t, 400, "invalid_request_error")
			if msg := e["message"].(string); !strings.Contains(msg, "upload it first") || !strings.Contains(msg, "an empty file is refused") {
				t.Fatalf("start after an empty upload: %q", msg)
			}
		})
	}
}

// An upload over storage.max_upload_bytes is refused (EntityTooLarge),
// and the start after it said only that an empty file is refused: the
// client saw no word of the limit it had passed.
func TestTooLargeUploadIsRefusedAndStartSaysSo(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{extra: "storage:\n  max_upload_bytes: 64"})
	c := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	big := bytes.Repeat([]byte(`{"text": "I was charged twice"}`+"\n"), 4)
	if status, msg := testutil.PostForm(t, c.UploadURL, c.UploadFields, big); status != 400 || !strings.Contains(msg, "EntityTooLarge") {
		t.Fatalf("upload of %d bytes: %d %s; want 400 EntityTooLarge", len(big), status, msg)
	}
	e := h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").apiError(t, 400, "invalid_request_error")
	if msg := e["message"].(string); !strings.Contains(msg, "upload it first") || !strings.Contains(msg, "storage.max_upload_bytes") || !strings.Contains(msg, "EntityTooLarge") {
		t.Fatalf("start after a too-large upload: %q", msg)
	}
}

// TestBatchConflicts checks every 409 rule of spec section 3, and that a
// start without an uploaded file is refused and leaves the job pending.
// Each 409 says x-should-retry: false: the OpenAI SDKs retried every one
// twice, over about 2 s, for the same answer.
func TestBatchConflicts(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{}) // no worker yet: started jobs stay processing
	a := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	b := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	conflict := func(method, path string) map[string]any {
		t.Helper()
		r := h.call(method, path, h.key, "")
		if got := r.header.Get("x-should-retry"); got != "false" {
			t.Errorf("%s %s: x-should-retry %q, want false", method, path, got)
		}
		return r.apiError(t, 409, "conflict")
	}

	e := h.call("POST", "/v1/batch/"+a.JobID+"/start", h.key, "").apiError(t, 400, "invalid_request_error")
	if !strings.Contains(e["message"].(string), "upload it first") {
		t.Fatalf("start without a file: %v", e["message"])
	}
	if job := h.call("GET", "/v1/batch/"+a.JobID, h.key, "").object(t, 200); job["status"] != "pending" {
		t.Fatalf("after a refused start: %v", job)
	}
	conflict("GET", "/v1/batch/"+a.JobID+"/results")

	h.upload(a, []byte(batchInput))
	h.upload(b, []byte(batchInput))
	h.call("POST", "/v1/batch/"+a.JobID+"/start", h.key, "").object(t, 202)
	e = conflict("POST", "/v1/batch/"+b.JobID+"/start")
	if !strings.Contains(e["message"].(string), a.JobID) {
		t.Fatalf("409 does not name the running job: %v", e["message"])
	}
	conflict("POST", "/v1/batch/"+a.JobID+"/start")
	conflict("GET", "/v1/batch/"+a.JobID+"/results")
	conflict("DELETE", "/v1/batch/"+a.JobID)
	// A pending job can be deleted while another processes.
	h.call("DELETE", "/v1/batch/"+b.JobID, h.key, "").object(t, 200)

	h.startWorker()
	if job := h.poll(h.key, a.JobID); job["status"] != "completed" {
		t.Fatalf("job %v", job)
	}
	conflict("POST", "/v1/batch/"+a.JobID+"/start")
	c := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	h.upload(c, []byte(batchInput))
	h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, 202) // the slot is free again
}

// TestBatchPendingCapIs409: jobs were unlimited (24,468 in 9 s from one
// account). Past batch.max_pending_jobs a create is a 409 of its own code,
// naming the setting, that the SDKs are told not to retry: waiting does
// not lower the count.
func TestBatchPendingCapIs409(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{extra: "batch:\n  max_pending_jobs: 1\n"})
	h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	r := h.call("POST", "/v1/batch", h.key, `{"labels": ["billing", "bug"]}`)
	if got := r.header.Get("x-should-retry"); got != "false" {
		t.Errorf("x-should-retry %q, want false", got)
	}
	e := r.apiError(t, 409, "too_many_batch_jobs")
	if msg := e["message"].(string); !strings.Contains(msg, "batch.max_pending_jobs is 1") {
		t.Errorf("message %q does not name the setting", msg)
	}
}

// TestBatchCreatesPerHourIs429: past batch.max_jobs_created_per_hour a
// create is a 429 in the OpenAI envelope naming the setting, with the wait
// in Retry-After and retry-after-ms; a wait the SDKs would not honour (over
// a minute) is sent with x-should-retry: false, as their quick retries
// would be refused the same.
func TestBatchCreatesPerHourIs429(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{extra: "batch:\n  max_jobs_created_per_hour: 1\n"})
	h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	r := h.call("POST", "/v1/batch", h.key, `{"labels": ["billing", "bug"]}`)
	e := r.apiError(t, 429, "rate_limit_exceeded")
	if msg := e["message"].(string); !strings.Contains(msg, "batch.max_jobs_created_per_hour is 1") {
		t.Errorf("message %q does not name the setting", msg)
	}
	retryAfter, _ := strconv.Atoi(r.header.Get("Retry-After"))
	retryMS, _ := strconv.Atoi(r.header.Get("retry-after-ms"))
	if retryAfter < 3500 || retryAfter > 3600 || retryMS < 3_500_000 || retryMS > 3_600_000 || r.header.Get("x-should-retry") != "false" {
		t.Errorf("Retry-After %q, retry-after-ms %q, x-should-retry %q: want the hour less the moments since the first job, and false",
			r.header.Get("Retry-After"), r.header.Get("retry-after-ms"), r.header.Get("x-should-retry"))
	}
}

// The OpenAI Files and Batch APIs are not served, and a client of them
// (the SDKs' client.files.create, client.batches.create) is pointed to
// /v1/batch: they got a bare "no route for POST /v1/batches", with a key
// or without.
func TestOpenAIBatchAndFilesAPIsPointToBatchJobs(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{})
	for _, c := range []struct{ method, path, key string }{
		{"POST", "/v1/batches", h.key},
		{"GET", "/v1/batches/batch_abc123", h.key},
		{"POST", "/v1/batches/batch_abc123/cancel", ""},
		{"POST", "/v1/files", h.key},
		{"GET", "/v1/files", ""},
		{"GET", "/v1/files/file-abc123/content", h.key},
	} {
		e := h.call(c.method, c.path, c.key, "").apiError(t, 404, "not_found")
		msg, _ := e["message"].(string)
		if !strings.Contains(msg, "no route for "+c.method+" "+c.path) || !strings.Contains(msg, "OpenAI Files and Batch APIs") || !strings.Contains(msg, "/v1/batch,") {
			t.Errorf("%s %s: %q; want it pointed to /v1/batch", c.method, c.path, msg)
		}
	}
	if r := h.call("GET", "/v1/batch", h.key, ""); r.status != 200 { // …which still answers
		t.Fatalf("GET /v1/batch: %s", r)
	}
}

// TestBatchUploadPolicies: the store takes only the upload the gateway
// signed, and only until it expires.
func TestBatchUploadPolicies(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{extra: "storage:\n  upload_ttl: 1s"})
	c := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	other := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	forge := func(change func(map[string]string)) map[string]string {
		f := map[string]string{}
		for k, v := range c.UploadFields {
			f[k] = v
		}
		change(f)
		return f
	}
	policy, _ := base64.StdEncoding.DecodeString(c.UploadFields["policy"])
	for name, fields := range map[string]map[string]string{
		"another job's key":      forge(func(f map[string]string) { f["key"] = other.InputKey }),
		"a rewritten policy":     forge(func(f map[string]string) { f["policy"] = base64.StdEncoding.EncodeToString(append(policy, ' ')) }),
		"another job's policy":   forge(func(f map[string]string) { f["policy"] = other.UploadFields["policy"] }),
		"a made-up signature":    forge(func(f map[string]string) { f["x-amz-signature"] = strings.Repeat("0", 64) }),
		"no signature":           forge(func(f map[string]string) { delete(f, "x-amz-signature") }),
		"someone else's account": forge(func(f map[string]string) { f["key"] = strings.Replace(c.InputKey, "acme", "globex", 1) }),
	} {
		if status, msg := testutil.PostForm(t, c.UploadURL, fields, []byte(batchInput)); status != http.StatusForbidden && status != http.StatusBadRequest {
			t.Errorf("upload with %s: %d %s, want it refused", name, status, msg)
		}
	}
	time.Sleep(2100 * time.Millisecond)
	if status, msg := testutil.PostForm(t, c.UploadURL, c.UploadFields, []byte(batchInput)); status != http.StatusForbidden {
		t.Fatalf("upload after the policy expired: %d %s, want 403", status, msg)
	}
	// Starting it says the form expired, not to upload to it, at the
	// time create gave as upload_expires_at (it had whole seconds).
	if r := h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, ""); r.status != 400 ||
		!strings.Contains(string(r.body), "upload form expired at "+c.UploadExpiresAt+" ") {
		t.Fatalf("start after the form expired: %s; want it to say the form expired at %s, its upload_expires_at", r, c.UploadExpiresAt)
	}
	h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").apiError(t, 400, "invalid_request_error")
	h.call("POST", "/v1/batch/"+other.JobID+"/start", h.key, "").apiError(t, 400, "invalid_request_error")
}

// TestBatchOtherAccountsJobsAreInvisible: every route answers 404 for
// another account's job, exactly as for a job that does not exist.
func TestBatchOtherAccountsJobsAreInvisible(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{})
	if _, err := h.harness.svc.CreateAccount(h.ctx, "globex", 5*money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	intruder := h.newKey("globex", accounts.KeyRequest{Name: "intruder"})
	c := h.createJob(h.key, `{"labels": ["billing", "bug"]}`)
	h.upload(c, []byte(batchInput))
	missing := "01900000-0000-7000-8000-000000000000"
	for _, id := range []string{c.JobID, missing} {
		for _, r := range []struct{ method, path string }{
			{"GET", "/v1/batch/" + id}, {"POST", "/v1/batch/" + id + "/start"},
			{"GET", "/v1/batch/" + id + "/results"}, {"DELETE", "/v1/batch/" + id},
		} {
			h.call(r.method, r.path, intruder, "").apiError(t, 404, "not_found")
		}
	}
	if list := h.call("GET", "/v1/batch", intruder, ""); list.status != 200 || strings.TrimSpace(string(list.body)) != "[]" {
		t.Fatalf("globex's list: %s", list)
	}
	if job := h.call("GET", "/v1/batch/"+c.JobID, h.key, "").object(t, 200); job["status"] != "pending" {
		t.Fatalf("the owner's job after the attempts: %v", job)
	}
}

func TestBatchListNewestFirst(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{})
	var ids []string
	for range 22 {
		ids = append(ids, h.createJob(h.key, `{"labels": ["a", "b"]}`).JobID)
	}
	r := h.call("GET", "/v1/batch", h.key, "")
	var items []map[string]any
	if err := json.Unmarshal(r.body, &items); err != nil || r.status != 200 {
		t.Fatalf("list: %s", r)
	}
	if len(items) != 20 {
		t.Fatalf("%d jobs listed, want the 20 most recent", len(items))
	}
	for i, it := range items {
		if it["job_id"] != ids[len(ids)-1-i] {
			t.Fatalf("item %d is %v, want %s (newest first)", i, it["job_id"], ids[len(ids)-1-i])
		}
		keys := make([]string, 0, len(it))
		for k := range it {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"created_at", "job_id", "requests_completed", "requests_total", "status"}) {
			t.Fatalf("list item fields %v, want the spec's five", keys)
		}
	}
	// OpenAI's list parameters were taken and ignored: 20 jobs for
	// limit=2, the same 20 for the page after one.
	for q, name := range map[string]string{"limit=2": "limit", "after=" + ids[5] + "&limit=2": "after", "order=asc": "order", "li%6Dit=5": "limit"} {
		r := h.call("GET", "/v1/batch?"+q, h.key, "")
		if r.status != 400 || !strings.Contains(string(r.body), `"param":"`+name+`"`) || !strings.Contains(string(r.body), "20 newest jobs") {
			t.Errorf("GET /v1/batch?%s: %s; want a 400 naming %s", q, r, name)
		}
	}
}

func TestBatchRequestValidation(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{})
	labels := make([]string, 201)
	for i := range labels {
		labels[i] = fmt.Sprintf("l%d", i)
	}
	many, _ := json.Marshal(map[string]any{"labels": labels})
	for _, tc := range []struct{ body, param, msg string }{
		{``, "", "body is empty"},
		{`{}`, "labels", "labels is required"},
		{`{"labels": []}`, "labels", ""},
		{string(many), "labels", "200"},
		{`{"lables": ["a"]}`, "lables", `did you mean "labels"`},
		{`{"labels": ["a"], "mode": "several"}`, "mode", ""},
		{`{"labels": ["a"], "threshold": 2}`, "threshold", ""},
		{`{"labels": ["a"], "classifier": "support-intent"}`, "labels", "cannot be sent with classifier"},
		{`{"classifier": "nope"}`, "classifier", "not defined"},
		{`{"labels": ["a"], "descriptions": {"b": "x"}}`, "descriptions", ""},
		{`{"labels": ["a", "b"], "model": "gpt-9"}`, "model", "does not exist"},
		{`{"labels": ["a"], "text": "per line, not here"}`, "text", "unknown field"},
		{`{"labels": ["a"], "labels": ["b"]}`, "labels", `duplicate key "labels"`},
		{`{"labels": ["a"], "mode": "multi", "threshold": 1e400}`, "threshold", "threshold must be a number between 0 and 1, got 1e400"},
		// Every line would answer "a" at confidence 1 (TestOneLabelSingleModeIsRefused).
		{`{"labels": ["a"]}`, "labels", `single mode with one label always answers it`},
		{`{"labels": ["a"], "mode": "single"}`, "labels", `send "mode": "multi"`},
		// Every line would tie: plugins.engine lexical reads both as "c".
		{`{"labels": ["C", "C++"]}`, "labels[1]", `the offline engines (semantic and lexical) read only words and do not tell them apart; the llm engine does (send "model": "llm")`},
		{`{"labels": ["a", "b"], "descriptions": {"a\ud800": "x"}}`, "descriptions.a", "escapes a lone surrogate"},
	} {
		r := h.call("POST", "/v1/batch", h.key, tc.body)
		e := r.apiError(t, 400, "invalid_request_error")
		if p, _ := e["param"].(string); !strings.HasPrefix(p, tc.param) || !strings.Contains(e["message"].(string), tc.msg) {
			t.Errorf("body %.60s: param %v message %q; want %q containing %q", tc.body, e["param"], e["message"], tc.param, tc.msg)
		}
	}
	h.call("POST", "/v1/batch", "", `{"labels": ["a"]}`).apiError(t, 401, "INVALID_API_KEY")
	classifyOnly := h.newKey("acme", accounts.KeyRequest{Name: "c", Scopes: []string{accounts.ScopeClassify}})
	h.call("GET", "/v1/batch", classifyOnly, "").apiError(t, 403, "permission_denied")
	largeOnly := h.newKey("acme", accounts.KeyRequest{Name: "l", Models: []string{"large"}})
	h.call("POST", "/v1/batch", largeOnly, `{"labels": ["a", "b"], "model": "small"}`).apiError(t, 403, "permission_denied")
	h.createJob(largeOnly, `{"labels": ["a", "b"], "model": "lexical"}`)
	h.createJob(h.key, `{"labels": ["C", "C++", "C#"], "model": "llm"}`) // a model reads them as written

	h.call("PUT", "/v1/batch", h.key, "").apiError(t, 405, "method_not_allowed")
	c := h.createJob(h.key, `{"labels": ["a", "b"]}`)
	if r := h.call("POST", "/v1/batch/"+c.JobID, h.key, ""); r.status != 405 || r.header.Get("Allow") != "DELETE, GET, HEAD" {
		t.Errorf("POST on a job: %s (Allow %q)", r, r.header.Get("Allow"))
	}
	if r := h.call("PUT", "/v1/batch/"+c.JobID, h.key, ""); r.status != 405 || r.header.Get("Allow") != "DELETE, GET, HEAD" {
		t.Errorf("PUT on a job: %s (Allow %q)", r, r.header.Get("Allow"))
	}
	if r := h.call("PATCH", "/v1/batch/"+c.JobID+"/results", h.key, ""); r.status != 405 || r.header.Get("Allow") != "GET, HEAD" {
		t.Errorf("PATCH on results: %s (Allow %q)", r, r.header.Get("Allow"))
	}
	if r := h.call("GET", "/v1/batch/"+c.JobID+"/start", h.key, ""); r.status != 405 || r.header.Get("Allow") != "POST" {
		t.Errorf("GET on start: %s", r)
	}
	h.call("GET", "/v1/batch/"+c.JobID+"/log", h.key, "").apiError(t, 404, "not_found")
	h.call("GET", "/v1/batch/not-an-id", h.key, "").apiError(t, 404, "not_found")
}

func TestBatchWithoutStorageIs503(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.keyed("/v1/batch", `{"labels": ["a"]}`)
	if r.status != 503 || !strings.Contains(string(r.body), "object storage") || !strings.Contains(string(r.body), `"code":"batch_unavailable"`) {
		t.Fatalf("batch without a service: %s", r)
	}
}

// A job is billed when it ends, so the account's balance is asked against
// the estimate once the input is counted: a job it cannot pay for within
// the grace buffer fails unbilled instead of overdrawing it by any amount.
func TestBatchTheAccountCannotPayForFailsUnbilled(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{extra: "batch:\n  price_per_token: \"0.005\"\n"})
	h.startWorker()
	h.g.CreateAccount("poor", money.NanosPerUSD/100)
	key := h.newKey("poor", accounts.KeyRequest{Name: "poor"})
	// Three times the input: its tokens at 0.005 USD, the most a batch
	// price may be, cost more than the credit and the 0.50 grace.
	input := []byte(strings.Repeat(batchInput, 3))
	c := h.createJob(key, `{"classifier": "support-intent"}`)
	h.upload(c, input)
	h.call("POST", "/v1/batch/"+c.JobID+"/start", key, "").object(t, 202)
	job := h.poll(key, c.JobID)
	if msg, _ := job["error"].(string); job["status"] != "failed" || !strings.Contains(msg, "cannot pay") {
		t.Fatalf("job of %v estimated tokens at 0.005 USD each, on 0.01 USD of credit: %v", job["estimated_tokens"], job)
	}
	time.Sleep(100 * time.Millisecond)
	for _, ev := range h.rec.Events() {
		if ev.Account == "poor" {
			t.Fatalf("the failed job was billed: %+v", ev)
		}
	}
	// The same job on an account that can pay completes.
	c = h.createJob(h.key, `{"classifier": "support-intent"}`)
	h.upload(c, input)
	h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, 202)
	if job := h.poll(h.key, c.JobID); job["status"] != "completed" {
		t.Fatalf("job of an account with 10 USD: %v", job)
	}
}

// A job started right after another completed counts that one's bill,
// which may not be in the balance yet: jobs in a row each passed the check
// against a balance without the last one's debit.
func TestBatchJobsInARowCountTheLastOnesBill(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{extra: "batch:\n  price_per_token: \"0.005\"\n"})
	h.startWorker()
	run := func(key string) map[string]any {
		c := h.createJob(key, `{"classifier": "support-intent"}`)
		h.upload(c, []byte(batchInput))
		h.call("POST", "/v1/batch/"+c.JobID+"/start", key, "").object(t, 202)
		return h.poll(key, c.JobID)
	}
	first := run(h.key)
	cost := money.Nanos(first["estimated_tokens"].(float64)) * money.NanosPerUSD / 200
	// Enough for one job within the 0.50 grace, not for two.
	h.g.CreateAccount("tight", cost*3/2-money.NanosPerUSD/2)
	key := h.newKey("tight", accounts.KeyRequest{Name: "tight"})
	if job := run(key); job["status"] != "completed" {
		t.Fatalf("the first job: %v", job)
	}
	// The gateway that billed the last job counts its bill in the balance
	// until the debit comes (another process would count it as a job not
	// debited yet).
	job := run(key)
	if msg, _ := job["error"].(string); job["status"] != "failed" || !strings.Contains(msg, "cannot pay") {
		t.Fatalf("the second job right after the first: %v", job)
	}

	// Once the billing consumer has debited the last job, it is not
	// counted again: an account that can pay for one more job after that
	// debit was refused for two minutes.
	h.g.CreateAccount("paid", cost*21/10-money.NanosPerUSD/2)
	key = h.newKey("paid", accounts.KeyRequest{Name: "paid"})
	job = run(key)
	if job["status"] != "completed" {
		t.Fatalf("the first job: %v", job)
	}
	bill := money.Nanos(job["actual_tokens"].(float64)) * money.NanosPerUSD / 200
	before, _ := h.g.Accounts.Debited("paid")
	if _, err := h.g.Accounts.Debit(h.ctx, "paid", bill); err != nil { // what the billing consumer does
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if now, _ := h.g.Accounts.Debited("paid"); now != before+bill {
			return fmt.Errorf("debited %s, want %s", now, before+bill)
		}
		return nil
	})
	if job := run(key); job["status"] != "completed" {
		t.Fatalf("the second job, after the first one's debit: %v", job)
	}
}

// TestBatchWrongLLMAnswersAreBilled: a line the llm answered wrongly twice
// is an error line carrying the two calls' tokens, counted in the job's
// actual_tokens; with auto the offline answer's tokens include them.
func TestBatchWrongLLMAnswersAreBilled(t *testing.T) {
	for _, tc := range []struct{ engine, model string }{{"lexical", `"llm"`}, {"auto", ""}} {
		h := newBatchHarness(t, "local", harnessOptions{upstream: proxytest.Options{BadAnswerTimes: 1 << 30},
			plugins: "  engine: " + tc.engine + "\n  llm_model: small"})
		h.startWorker()
		body := `{"labels": ["bug", "billing"]}`
		if tc.model != "" {
			body = `{"labels": ["bug", "billing"], "model": ` + tc.model + `}`
		}
		c := h.createJob(h.key, body)
		h.upload(c, []byte(`{"text": "The export button crashes"}`+"\n"))
		h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, 202)
		job := h.poll(h.key, c.JobID)
		if tc.model != "" {
			// Its one line failed, so the job failed, unbilled: but the
			// line still says what it cost.
			if job["status"] != "failed" || !strings.Contains(fmt.Sprint(job["error"]), "not the answer asked") {
				t.Fatalf("%s: job %v", tc.engine, job)
			}
			continue
		}
		_, data := download(t, h.call("GET", "/v1/batch/"+c.JobID+"/results", h.key, "").object(t, 200)["download_url"].(string))
		var line struct {
			Tokens int64  `json:"tokens"`
			Engine string `json:"engine"`
		}
		if err := json.Unmarshal(data, &line); err != nil || line.Engine != "lexical" {
			t.Fatalf("%s: results %s", tc.engine, data)
		}
		offline := h.call("POST", "/v1/classify", h.key, `{"text": "The export button crashes", "labels": ["bug", "billing"], "model": "lexical"}`).object(t, 200)
		lexical := int64(offline["usage"].(map[string]any)["total_tokens"].(float64))
		if line.Tokens <= lexical || job["actual_tokens"] != float64(line.Tokens) {
			t.Errorf("%s: line tokens %d (lexical alone %d), actual_tokens %v: want the llm's two calls added", tc.engine, line.Tokens, lexical, job["actual_tokens"])
		}
	}
}

// A start that cannot reach the object store is a 503 to retry, without
// the store's address: it was a 500 quoting the private S3 endpoint.
func TestBatchStartWithTheStoreDownIs503(t *testing.T) {
	h := newBatchHarness(t, "s3", harnessOptions{})
	c := h.createJob(h.key, `{"classifier": "support-intent"}`)
	h.upload(c, []byte(batchInput))
	h.minio.Stop()
	r := h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "")
	if r.status != 503 || !strings.Contains(string(r.body), `"code":"batch_unavailable"`) || strings.Contains(string(r.body), "127.0.0.1") {
		t.Fatalf("start with the store down: %s", r)
	}
	// An outage ends by itself: the SDKs are told to wait a second.
	if r.header.Get("Retry-After") != "1" || r.header.Get("retry-after-ms") != "1000" {
		t.Fatalf("start with the store down: Retry-After %q, retry-after-ms %q; want 1 and 1000", r.header.Get("Retry-After"), r.header.Get("retry-after-ms"))
	}
}

// TestBatchLinesAreDescribedAndBilledAsClassifyAlone: a job's lines are
// described and billed as the same call made alone to /v1/classify. The
// job's event named no upstream for a model served by a pool, and, for a
// job whose model failed every line (auto) before lexical answered,
// said lexical, no upstream, usage from the tokenizer; and it billed the
// model's tokens at the batch price alone, a fraction of the model's own
// prices, which the same calls alone pay. The fallback lines said
// lexical without saying why.
func TestBatchLinesAreDescribedAndBilledAsClassifyAlone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	vectors, err := testutil.VectorsPath()
	if err != nil {
		t.Fatal(err)
	}
	offFormat := proxytest.Options{BadAnswerTimes: 1 << 30}
	for _, tc := range []struct {
		name  string
		ho    harnessOptions
		model string // the requests' "model" member, if any
	}{
		{"llm on a pool whose first member is down", harnessOptions{deadFirstMember: dead, plugins: "  engine: auto\n  llm_model: small"}, `, "model": "llm"`},
		{"auto whose model answers off-format", harnessOptions{upstream: offFormat, plugins: "  engine: auto\n  llm_model: small"}, ""},
		{"auto whose model answers off-format, with the word vectors", harnessOptions{upstream: offFormat,
			plugins: "  engine: auto\n  llm_model: small\n  vectors: " + vectors}, ""},
		{"llm whose upstream reports cached and reasoning tokens", harnessOptions{plugins: "  engine: llm\n  llm_model: small",
			upstream: proxytest.Options{PromptTokens: 10, CompletionTokens: 20, CachedTokens: 3, ReasoningTokens: 5}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newBatchHarness(t, "local", tc.ho)
			h.startWorker()
			const text, lines = "The export button crashes", 3
			alone := h.keyed("/v1/classify", `{"text": "`+text+`", "labels": ["bug", "billing"]`+tc.model+`}`).ok(t)
			single := h.events(1)[0]

			c := h.createJob(h.key, `{"labels": ["bug", "billing"]`+tc.model+`}`)
			h.upload(c, bytes.Repeat([]byte(`{"text": "`+text+`"}`+"\n"), lines))
			h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, 202)
			if job := h.poll(h.key, c.JobID); job["status"] != "completed" {
				t.Fatalf("job %v", job)
			}
			_, data := download(t, h.call("GET", "/v1/batch/"+c.JobID+"/results", h.key, "").object(t, 200)["download_url"].(string))
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				var line map[string]any
				if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
					t.Fatalf("result line %q: %v", sc.Text(), err)
				}
				if line["engine"] != alone["engine"] || line["model"] != alone["model"] || line["fallback"] != alone["fallback"] ||
					line["tokens"] != alone["usage"].(map[string]any)["total_tokens"] {
					t.Errorf("result line %s\nwant its engine, model, fallback and tokens as the call alone: %v", sc.Text(), alone)
				}
			}
			ev := h.events(2)[1]
			if ev.JobID != c.JobID || ev.Model != single.Model || ev.Upstream != single.Upstream || ev.UsageSource != single.UsageSource ||
				ev.PromptTokens != lines*single.PromptTokens || ev.CompletionTokens != lines*single.CompletionTokens || ev.CostNanos != lines*single.CostNanos ||
				ev.CachedTokens != lines*single.CachedTokens || ev.ReasoningTokens != lines*single.ReasoningTokens {
				t.Errorf("job event %+v\nwant %d times the call alone's: %+v", *ev, lines, *single)
			}
			if single.Model != "small" || single.Upstream != "local" {
				t.Errorf("the call alone's event %+v: want the model small at upstream local", *single)
			}
			if reported := tc.ho.upstream.CachedTokens; reported > 0 && single.CachedTokens != int64(reported) {
				t.Errorf("the call alone's event %+v: want the %d cached tokens its upstream reported", *single, reported)
			}
		})
	}
}

// TestBatchAutoLinesAfterADroppedConnectionSayWhy: in an auto job whose
// upstream dropped the connections of a few calls and answered every
// other, the lines after the failure went to the offline engine for 10 s
// (17,000 lines of 20,000) with no fallback saying why. Each line now
// goes to the llm or says why not (TestAutoAfterOneDroppedConnection:
// the llm answers again once a probe, due a second after the failure,
// finds its upstream).
func TestBatchAutoLinesAfterADroppedConnectionSayWhy(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{upstream: proxytest.Options{CutChatTimes: 8},
		plugins: "  engine: auto\n  llm_model: small"})
	h.startWorker()
	t.Logf("lines by engine: %v", h.autoJobSaysWhy(300))
}

// TestBatchAutoLinesWhileTheUpstreamIsDownSayWhy: once the probe that a
// failed call brought forward had failed too, a job's lines went to the
// offline engine with no fallback (after a 0.4 s blink of the upstream,
// 18,336 lines in a row). Every line the llm was not asked for says why,
// whichever failure took its upstream for down.
func TestBatchAutoLinesWhileTheUpstreamIsDownSayWhy(t *testing.T) {
	h := newBatchHarness(t, "local", harnessOptions{plugins: "  engine: auto\n  llm_model: small"})
	h.startWorker()
	const body = `{"text": "the export button crashes", "labels": ["bug", "billing"]}`
	if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "llm" {
		t.Fatalf("auto with the upstream up: %v", m)
	}
	h.up.Close()
	// A failed call, then, a second on, the probe it brought forward,
	// which fails too (the next call starts it).
	if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "lexical" || m["fallback"] == nil {
		t.Fatalf("auto with its upstream gone: %v", m)
	}
	time.Sleep(1100 * time.Millisecond)
	h.keyed("/v1/classify", body).ok(t)
	time.Sleep(200 * time.Millisecond)

	h.autoJobSaysWhy(200)
}

// autoJobSaysWhy runs a job of n lines through the worker, and fails the
// test on a result line the llm did not answer with no fallback saying
// why. It returns how many lines each engine answered.
func (h *batchHarness) autoJobSaysWhy(n int) map[string]int {
	t := h.t
	t.Helper()
	var input strings.Builder
	for i := range n {
		fmt.Fprintf(&input, "{\"text\": \"The export button crashes, ticket %d\"}\n", i)
	}
	c := h.createJob(h.key, `{"labels": ["bug", "billing"]}`)
	h.upload(c, []byte(input.String()))
	h.call("POST", "/v1/batch/"+c.JobID+"/start", h.key, "").object(t, 202)
	if job := h.poll(h.key, c.JobID); job["status"] != "completed" {
		t.Fatalf("job %v", job)
	}
	_, data := download(t, h.call("GET", "/v1/batch/"+c.JobID+"/results", h.key, "").object(t, 200)["download_url"].(string))
	engines := map[string]int{}
	for l := range bytes.Lines(data) {
		var line struct {
			Line     int    `json:"line"`
			Engine   string `json:"engine"`
			Fallback string `json:"fallback"`
		}
		if err := json.Unmarshal(l, &line); err != nil {
			t.Fatalf("result line %s: %v", l, err)
		}
		engines[line.Engine]++
		if line.Engine != "llm" && line.Fallback == "" {
			t.Fatalf("line %d answered by %s with no fallback saying why the llm was not", line.Line, line.Engine)
		}
	}
	return engines
}
