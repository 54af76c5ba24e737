package plugins_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// slowDisk is a meter.DurableRecorder whose events are safe from a crash
// delay after they are recorded, as under billing.durability fsync; a
// negative delay is a stuck disk. It counts the events made safe.
type slowDisk struct {
	*meter.Memory
	delay   time.Duration
	durable atomic.Int64
}

func (d *slowDisk) RecordDurable(ev *meter.Event) <-chan struct{} {
	d.Record(ev)
	safe := make(chan struct{})
	if d.delay >= 0 {
		time.AfterFunc(d.delay, func() {
			d.durable.Add(1)
			close(safe)
		})
	}
	return safe
}

// serveWithRecorder serves the plugins (engine llm, model small) in front
// of an upstream of options up, with rec as the gateway's recorder, and
// returns its base URL and a key of an account with 10 USD.
func serveWithRecorder(t *testing.T, rec meter.Recorder, up proxytest.Options) (url, key string) {
	t.Helper()
	ho := harnessOptions{plugins: "  engine: llm\n  llm_model: small", classifiers: defaultClassifiers}
	up.Reply = classifiers.NewViewModel(classifiers.NewLexical()).Reply
	g := gatewaytest.Start(t, gatewaytest.Options{
		Upstream: &up,
		Config:   ho.yaml,
		NoListen: true,
	})
	cfg, err := config.Load(g.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(cfg, proxy.Options{Accounts: g.Accounts, Recorder: rec,
		Modules: []proxy.Module{plugins.Module(plugins.Options{})}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	url = gatewaytest.Serve(t, srv)
	g.CreateAccount("acme", 10*money.NanosPerUSD)
	return url, g.CreateKey("acme", accounts.KeyRequest{Name: "test"})
}

func post(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPluginAnswersWaitForTheirEventOnDisk: with billing.durability fsync
// a chat answer's last byte waits for its usage event's fsync, but the
// plugins recorded without waiting, so /v1/classify's 200 went out 14 ms
// before the msync of its event (/v1/tag 32 ms): a power loss then lost
// the bill of an answer the client had. Each answer now comes after its
// event is safe.
func TestPluginAnswersWaitForTheirEventOnDisk(t *testing.T) {
	disk := &slowDisk{Memory: meter.NewMemory(nil), delay: 300 * time.Millisecond}
	url, key := serveWithRecorder(t, disk, proxytest.Options{})
	// A model answering off-format every time: its 502 is billed, and
	// waits alike.
	offFormat := &slowDisk{Memory: meter.NewMemory(nil), delay: 300 * time.Millisecond}
	failingURL, failingKey := serveWithRecorder(t, offFormat, proxytest.Options{BadAnswerTimes: 1 << 30})
	for _, c := range []struct {
		disk           *slowDisk
		url, key, path string
		body           string
		status         int
	}{
		{disk, url, key, "/v1/classify", `{"text": "I was charged twice this month", "classifier": "support-intent"}`, 200},
		{disk, url, key, "/v1/tag", `{"text": "I was charged twice this month", "tags": ["billing", "bug"]}`, 200},
		{disk, url, key, "/v1/score", `{"source": "URGENT: the server is down!", "attribute": "urgency"}`, 200},
		{disk, url, key, "/v1/match", `{"source": "refund policy", "query": "how do I get my money back"}`, 200},
		{offFormat, failingURL, failingKey, "/v1/classify", `{"text": "I was charged twice this month", "classifier": "support-intent"}`, 502},
	} {
		before := len(c.disk.Events())
		status, body := post(t, c.url+c.path, c.key, c.body)
		recorded, durable := len(c.disk.Events()), c.disk.durable.Load()
		if status != c.status {
			t.Errorf("%s: %d %s, want %d", c.path, status, body, c.status)
			continue
		}
		if recorded != before+1 || durable != int64(recorded) {
			t.Errorf("%s answered %d with %d events recorded, %d of them on disk: want the answer's event (#%d) on disk before it",
				c.path, status, recorded, durable, before+1)
		}
	}
}

// TestPluginAnswerWaitForTheDiskIsBounded: a stuck disk delays a plugin's
// answer by the bound chat answers wait, 2 s, and no more.
func TestPluginAnswerWaitForTheDiskIsBounded(t *testing.T) {
	disk := &slowDisk{Memory: meter.NewMemory(nil), delay: -1}
	url, key := serveWithRecorder(t, disk, proxytest.Options{})
	start := time.Now()
	status, body := post(t, url+"/v1/classify", key, `{"text": "I was charged twice this month", "classifier": "support-intent"}`)
	took := time.Since(start)
	if status != 200 || len(disk.Events()) != 1 {
		t.Fatalf("%d %s, %d events: want the answer and its event", status, body, len(disk.Events()))
	}
	if took < 1500*time.Millisecond || took > 10*time.Second {
		t.Errorf("answered in %s on a stuck disk: want after the 2 s bound, not long after", took)
	}
}
