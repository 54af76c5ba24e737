package batch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
	"github.com/tollgate/tollgate/storage"
)

// env is one gateway's worth of batch machinery (internal/gatewaytest): an
// embedded NATS server, the local object store on its own listener, a
// gateway (without a listener) for the configuration and the engines, and
// a usage recorder.
type env struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	cfgPath string
	broker  *broker.Broker
	store   *storage.Local
	secret  string
	gw      *proxy.Server
	g       *gatewaytest.Gateway
	rt      batch.Runtime // the runtime gw's plugins module provides
	rec     *meter.Memory
	up      *proxytest.Server
}

// envYAML: %[1]s data dir, %[2]s upstream base URL, %[3]s the plugins
// section's body, %[4]s the batch section's body, %[5]s more sections.
const envYAML = `
server:
  listen: 127.0.0.1:0
  data_dir: %[1]s
  demo_credit_usd: "0"
upstreams:
  - name: local
    base_url: %[2]s
    first_byte_timeout: 5s
models:
  - id: small
    upstream: local
    upstream_model: proxytest-small
    context_length: 100000
    max_output_length: 1000
plugins:
%[3]s
batch:
%[4]s
%[5]s
`

type envOptions struct {
	plugins string // default: engine lexical, max_text_bytes 1KiB
	batch   string // default: checkpoint_lines 300, concurrency 4
	more    string // more top-level sections, such as storage
}

func newEnv(t *testing.T, eo envOptions) *env {
	t.Helper()
	if eo.plugins == "" {
		eo.plugins = "  engine: lexical\n  max_text_bytes: 1KiB"
	}
	if eo.batch == "" {
		eo.batch = "  checkpoint_lines: 300\n  concurrency: 4"
	}
	e := &env{t: t, secret: "test-secret"}
	g := gatewaytest.Start(t, gatewaytest.Options{
		Upstream: &proxytest.Options{Reply: classifiers.NewViewModel(classifiers.NewLexical()).Reply},
		Config: func(upstream, dir string) string {
			return fmt.Sprintf(envYAML, dir, upstream, eo.plugins, eo.batch, eo.more)
		},
		Modules:  e.modules,
		NoListen: true,
	})
	e.ctx, e.dir, e.cfgPath, e.broker, e.gw, e.rec, e.up, e.g = g.Ctx, g.Dir, g.ConfigPath, g.Broker, g.Server, g.Recorder, g.Upstream, g
	return e
}

// modules starts the local object store and gives the gateway its plugins
// module, whose runtime gives jobs their engines: every service of the
// test runs on it, as on one gateway.
func (e *env) modules(g *gatewaytest.Gateway) []proxy.Module {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	e.store, err = storage.NewLocal(storage.LocalOptions{DataDir: g.Dir, PublicBaseURL: "http://" + ln.Addr().String(), SecretKey: e.secret, Logf: e.t.Logf})
	if err != nil {
		e.t.Fatal(err)
	}
	go func() { _ = e.store.Serve(ln) }()
	g.Defer(func() { _ = e.store.Shutdown(context.Background()) })
	open := func(ctx context.Context, rt batch.Runtime) (*batch.Service, error) {
		e.rt = rt
		return batch.Open(ctx, g.Broker.JetStream(), e.store, batch.Options{Runtime: rt, Recorder: g.Recorder, Logf: e.t.Logf})
	}
	return []proxy.Module{plugins.Module(plugins.Options{Batch: &plugins.Batch{Open: open}})}
}

// service opens a batch service on a NATS connection of its own, as
// another gateway would.
func (e *env) service(ackWait time.Duration, tun batch.Tuning) *batch.Service {
	e.t.Helper()
	return e.serviceNamed("", ackWait, tun)
}

// serviceNamed is service with the process name name in job records.
func (e *env) serviceNamed(name string, ackWait time.Duration, tun batch.Tuning) *batch.Service {
	e.t.Helper()
	return e.serviceOn(e.store, name, ackWait, tun)
}

// serviceOn is serviceNamed with its files in store (e.store, or one
// wrapping it to fail).
func (e *env) serviceOn(store storage.Store, name string, ackWait time.Duration, tun batch.Tuning) *batch.Service {
	e.t.Helper()
	return e.open(store, e.rt, name, ackWait, tun)
}

// serviceOnRuntime is serviceNamed on rt (one wrapping e.rt, as another
// gateway's process sees it).
func (e *env) serviceOnRuntime(rt batch.Runtime, name string) *batch.Service {
	e.t.Helper()
	return e.open(e.store, rt, name, 0, batch.Tuning{})
}

// open opens a service on a NATS connection of its own.
func (e *env) open(store storage.Store, rt batch.Runtime, name string, ackWait time.Duration, tun batch.Tuning) *batch.Service {
	e.t.Helper()
	b, err := broker.Start(e.ctx, config.NATS{URL: e.broker.ClientURL()}, e.dir, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(b.Close)
	svc, err := batch.Open(e.ctx, b.JetStream(), store, batch.WithTuning(batch.Options{
		Runtime: rt, Recorder: e.rec, Logf: e.t.Logf, AckWait: ackWait, Name: name,
	}, tun))
	if err != nil {
		e.t.Fatal(err)
	}
	return svc
}

// work runs svc's worker until the test ends or stop is called.
func (e *env) work(svc *batch.Service) (stop func()) {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := svc.RunWorker(ctx); err != nil {
			e.t.Errorf("RunWorker: %v", err)
		}
	}()
	stop = func() { cancel(); <-done }
	e.t.Cleanup(stop)
	return stop
}

// create makes a job of account with labels billing, bug, other and
// uploads input as its file.
func (e *env) create(svc *batch.Service, account string, input []byte, mode string) string {
	e.t.Helper()
	req := batch.Request{Labels: []string{"billing", "bug", "other"}, Mode: "single", Threshold: 0.5,
		Descriptions: map[string]string{"billing": "charges, invoices and refunds", "bug": "crashes and errors"}}
	if mode == "multi" {
		req.Mode, req.Threshold = classifiers.ModeMulti, 0.2
	}
	created, err := svc.Create(e.ctx, batch.CreateParams{Account: account, KeyID: "key-" + account, Request: req})
	if err != nil {
		e.t.Fatal(err)
	}
	if input != nil {
		e.put(created.InputKey, bytes.NewReader(input))
	}
	return created.JobID
}

// put writes an object straight into the store.
func (e *env) put(key string, r io.Reader) {
	e.t.Helper()
	up, err := e.store.Create(e.ctx, key)
	if err != nil {
		e.t.Fatal(err)
	}
	defer up.Abort()
	if _, err := io.Copy(up, r); err != nil {
		e.t.Fatal(err)
	}
	if err := up.Commit(); err != nil {
		e.t.Fatal(err)
	}
}

// startAndWait starts job id and waits up to 30 s for it to end.
func (e *env) startAndWait(svc *batch.Service, account, id string) *batch.Job {
	e.t.Helper()
	if _, err := svc.Start(e.ctx, account, id); err != nil {
		e.t.Fatal(err)
	}
	return e.waitEnd(svc, account, id, 30*time.Second)
}

// waitEnd polls the job until it is completed or failed.
func (e *env) waitEnd(svc *batch.Service, account, id string, within time.Duration) *batch.Job {
	e.t.Helper()
	var j *batch.Job
	checkFor(e.t, within, 20*time.Millisecond, func() error {
		var err error
		j, err = svc.Get(e.ctx, account, id)
		if err != nil {
			return err
		}
		if j.Status != batch.StatusCompleted && j.Status != batch.StatusFailed {
			return fmt.Errorf("job %s is %s at line %d of %d", id, j.Status, j.Progress.Lines, j.RequestsTotal)
		}
		return nil
	})
	return j
}

// results reads a completed job's results file.
func (e *env) results(j *batch.Job) []byte {
	e.t.Helper()
	if j.Status != batch.StatusCompleted {
		e.t.Fatalf("job %s is %s (%s), want completed", j.ID, j.Status, j.Error)
	}
	rc, err := e.store.Open(e.ctx, j.OutputKey)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		e.t.Fatal(err)
	}
	return data
}

// jobFiles lists the files of job id under the store's directory.
func (e *env) jobFiles(account, id string) []string {
	e.t.Helper()
	root := filepath.Join(e.dir, "objects", storage.LocalBucket, "batch", account, id)
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.t.Fatal(err)
	}
	return files
}

// wantOnlyInputAndResults waits until a completed job's parts are
// deleted, and checks nothing else is left.
func (e *env) wantOnlyInputAndResults(account, id string) {
	e.t.Helper()
	checkFor(e.t, 10*time.Second, 10*time.Millisecond, func() error {
		files := e.jobFiles(account, id)
		if len(files) != 2 || files[0] != "input.ndjson" && files[1] != "input.ndjson" || !contains(files, "/results.ndjson") {
			return fmt.Errorf("files after completion: %v; want the input and the results only", files)
		}
		return nil
	})
}

// jobEvents returns the usage events of job id.
func (e *env) jobEvents(id string) []*meter.Event {
	var evs []*meter.Event
	for _, ev := range e.rec.Events() {
		if ev.JobID == id {
			evs = append(evs, ev)
		}
	}
	return evs
}

// resultLine is one line of a results file.
type resultLine struct {
	Line       int64   `json:"line"`
	Label      string  `json:"label"`
	Confidence float64 `json:"confidence"`
	Labels     []struct {
		Label      string  `json:"label"`
		Confidence float64 `json:"confidence"`
	} `json:"labels"`
	Tokens int64  `json:"tokens"`
	Engine string `json:"engine"`
	Model  string `json:"model"`
	Error  string `json:"error"`
}

// checkResults checks that data has one line per input line, in order, and
// returns the lines and their tokens.
func checkResults(t *testing.T, data []byte, inputLines int) ([]resultLine, int64) {
	t.Helper()
	var lines []resultLine
	var tokens int64
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r resultLine
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("result line %d is not JSON: %q", len(lines)+1, sc.Text())
		}
		if r.Line != int64(len(lines)+1) {
			t.Fatalf("result line %d says line %d: lines lost, repeated or out of order", len(lines)+1, r.Line)
		}
		if r.Error == "" && (r.Engine != "lexical" && r.Engine != "semantic" && r.Engine != "llm" || (r.Model != "") != (r.Engine == "llm")) {
			t.Fatalf("result line %d does not name its engine: %s", r.Line, sc.Text())
		}
		lines = append(lines, r)
		tokens += r.Tokens
	}
	if len(lines) != inputLines {
		t.Fatalf("%d result lines, want one per input line (%d)", len(lines), inputLines)
	}
	return lines, tokens
}

// texts to classify: lexical answers them deterministically.
var sampleTexts = []string{
	"I was charged twice on my last invoice and want a refund",
	"The app crashes with an error every time I open settings",
	"What are your office hours on public holidays?",
	"Please refund the duplicate charge on my card",
	"Export fails with error 500 since the update",
}

// inputLines returns n input lines; every badEvery-th (if > 0) is not JSON.
func inputLines(n, badEvery int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		if badEvery > 0 && i%badEvery == 0 {
			b.WriteString("this line is not JSON\n")
			continue
		}
		text, _ := json.Marshal(fmt.Sprintf("%s (ticket %d)", sampleTexts[i%len(sampleTexts)], i))
		fmt.Fprintf(&b, "{\"id\": %d, \"text\": %s}\n", i, text)
	}
	return b.Bytes()
}

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor

// kv opens one of the batch buckets.
func (e *env) kv(bucket string) jetstream.KeyValue {
	e.t.Helper()
	kv, err := e.broker.JetStream().KeyValue(e.ctx, bucket)
	if err != nil {
		e.t.Fatal(err)
	}
	return kv
}

func contains(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
