package plugins_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// vectorsPath is where the gateway's default config finds the word
// vectors; a missing file fails the test: make test installs it.
func vectorsPath(t *testing.T) string {
	t.Helper()
	path, err := testutil.VectorsPath()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSemanticIsTheOfflineEngine: with the upstream down, auto answers
// with semantic, which knows that a parcel is about shipping although no
// word is shared; every endpoint names it, and usage events carry it as
// the model.
func TestSemanticIsTheOfflineEngine(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 503},
		plugins: "  engine: auto\n  vectors: " + vectorsPath(t)})
	m := h.keyed("/v1/classify", `{"text": "My parcel has not arrived yet.", "labels": ["billing", "shipping", "account"]}`).ok(t)
	if m["engine"] != "semantic" || m["label"] != "shipping" || m["tie"] != nil {
		t.Errorf("classify with the upstream down: %v", m)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/tag", `{"text": "The striker scored twice.", "tags": ["football", "cooking"]}`},
		{"/v1/score", `{"source": "Thank you so much for your patience.", "attribute": "politeness"}`},
		{"/v1/match", `{"source": "Hold the button on the modem for ten seconds.", "query": "how to reset my router"}`},
		{"/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "semantic"}`},
	} {
		if m := h.keyed(c.path, c.body).ok(t); m["engine"] != "semantic" {
			t.Errorf("%s: engine %v, want semantic", c.path, m["engine"])
		}
	}
	for _, ev := range h.events(5) {
		if ev.Model != "semantic" {
			t.Errorf("usage event of %s: model %q, want semantic", ev.Endpoint, ev.Model)
		}
	}
	// lexical stays selectable.
	if m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`).ok(t); m["engine"] != "lexical" {
		t.Errorf("model lexical: %v", m)
	}
}

// TestSemanticWithoutVectors: a missing vectors file leaves the gateway
// working: the offline engine is lexical and says so, and asking for
// semantic by name is a 503 that says how to install the vectors.
func TestSemanticWithoutVectors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.tgv")
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 503},
		plugins: "  engine: semantic\n  vectors: " + missing})
	m := h.keyed("/v1/classify", `{"text": "My parcel has not arrived yet.", "labels": ["billing", "shipping"]}`).ok(t)
	if m["engine"] != "lexical" {
		t.Errorf("engine semantic without vectors: %v", m)
	}
	e := h.keyed("/v1/score", `{"source": "x", "attribute": "urgency", "model": "semantic"}`).apiError(t, 503, "engine_unavailable")
	if msg := e["message"].(string); !strings.Contains(msg, "scripts/vectors.sh install") || !strings.Contains(msg, missing) {
		t.Errorf("503 message %q: want the file and the fix", msg)
	}

	// The admin installs the file and reloads the config: semantic answers,
	// without a restart.
	if err := os.Symlink(vectorsPath(t), missing); err != nil {
		t.Fatal(err)
	}
	h.writeConfig(harnessOptions{plugins: "  engine: semantic\n  vectors: " + missing + "\n  # reloaded"})
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		m := h.keyed("/v1/classify", `{"text": "My parcel has not arrived yet.", "labels": ["billing", "shipping"]}`).ok(t)
		if m["engine"] != "semantic" {
			return fmt.Errorf("after a reload with the vectors installed, engine %v, want semantic", m["engine"])
		}
		return nil
	})
}

// The vectors installed after the gateway started were not used until
// the config was edited or SIGHUP sent: saving gateway.yaml unchanged
// reloads nothing. A missing file is looked for again by the calls.
func TestSemanticVectorsInstalledAfterStartAreUsedWithoutAReload(t *testing.T) {
	plugins.LookForMissingVectorsEvery(t, 200*time.Millisecond)
	missing := filepath.Join(t.TempDir(), "none.tgv")
	var log testutil.Log
	h := newHarness(t, harnessOptions{plugins: "  engine: semantic\n  vectors: " + missing, logf: log.Logf})
	body := `{"text": "My parcel has not arrived yet.", "labels": ["billing", "shipping"]}`
	for range 3 {
		if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "lexical" {
			t.Fatalf("engine semantic without vectors: %v", m)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err := os.Symlink(vectorsPath(t), missing); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "semantic" {
			return fmt.Errorf("with the vectors installed and no reload, engine %v, want semantic", m["engine"])
		}
		return nil
	})
	if n := strings.Count(log.String(), "semantic engine unavailable"); n != 1 {
		t.Errorf("the missing file was said %d times, want once:\n%s", n, &log)
	}
}

// A corrupt vectors file is said once, with the fix once: the message
// read "…cannot be used (<file>: vectors file is corrupt or truncated;
// rebuild it with scripts/vectors.sh install): run scripts/vectors.sh
// install again".
func TestSemanticCorruptVectorsAreSaidOnce(t *testing.T) {
	corrupt := filepath.Join(t.TempDir(), "cut.tgv")
	if err := os.WriteFile(corrupt, []byte("TGVEC001 cut short"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, harnessOptions{plugins: "  engine: semantic\n  vectors: " + corrupt})
	e := h.keyed("/v1/score", `{"source": "x", "attribute": "urgency", "model": "semantic"}`).apiError(t, 503, "engine_unavailable")
	msg := e["message"].(string)
	if strings.Count(msg, "scripts/vectors.sh install") != 1 || strings.Count(msg, corrupt) != 1 || !strings.Contains(msg, "corrupt or truncated") {
		t.Errorf("503 message %q: want the file, what is wrong and the fix, once each", msg)
	}
}

// tollgate serve preloads the vectors: a missing file is said in the log
// as the gateway starts, before any request needs it.
func TestSemanticMissingVectorsAreSaidAtStart(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.tgv")
	var log testutil.Log
	newHarness(t, harnessOptions{plugins: "  engine: semantic\n  vectors: " + missing, preloadVectors: true, logf: log.Logf})
	for _, line := range log.Matching() {
		if strings.Contains(line, "semantic engine unavailable") && strings.Contains(line, missing) {
			return
		}
	}
	t.Errorf("started with a missing vectors file and no request yet, the log says nothing of it:\n%s", &log)
}

// Label sets that joined into the same text shared a cache entry: the
// second call got the first's compiled set, with fewer labels, and the
// process ended on an index out of range; a crafted set changed another
// caller's answer. Each set now answers as on a fresh gateway.
func TestLabelSetsThatJoinAlikeAreKeptApart(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: semantic\n  vectors: " + vectorsPath(t)})
	for _, pair := range [][2]string{
		{`{"text": "I like fruit", "labels": ["apple\nbanana"], "mode": "multi"}`, `{"text": "I like fruit", "labels": ["apple", "banana"], "mode": "multi"}`},
		{`{"text": "I like fruit", "labels": ["apple\u0000banana", "cherry"]}`, `{"text": "I like fruit", "labels": ["apple", "banana", "cherry"]}`},
		{`{"text": "x", "labels": ["a: b"], "mode": "multi"}`, `{"text": "x", "labels": ["a"], "descriptions": {"a": "b"}, "mode": "multi"}`},
	} {
		for _, body := range pair {
			for _, model := range []string{"semantic", "lexical"} {
				h.keyed("/v1/classify", strings.Replace(body, `{"text"`, `{"model": "`+model+`", "text"`, 1)).ok(t)
			}
		}
	}
	h.keyed("/v1/classify", `{"text": "x", "labels": ["billing\n  I was charged twice\nbug", "  crash"]}`).ok(t)
	victim := `{"labels": ["billing", "bug"], "examples": {"billing": ["I was charged twice"], "bug": ["crash"]}, "text": "There is a bug in the export"}`
	if m := h.keyed("/v1/classify", victim).ok(t); m["label"] != "bug" {
		t.Fatalf("after a crafted label set: %v", m)
	}
}
