package console

import (
	"net/url"
	"strings"
	"testing"
)

// A store write refused by NATS (a stream electing its leader answers
// "no response from stream") was a 500 "could not read the key form":
// the key may or may not have been made, and the page that says so, and
// that sending the form again makes no second key, is the one a timeout
// gets. The bucket is deleted so that its writes meet no stream, as they
// do while one has no leader.
func TestKeyFormRefusedByNATSSaysTheKeyMayHaveBeenMade(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	form := b.keyForm(url.Values{"name": {"ci"}, "scopes": {"generate"}})
	if err := g.broker.JetStream().DeleteKeyValue(t.Context(), BucketKeyForms); err != nil {
		t.Fatal(err)
	}
	resp := b.post("/console/keys", form)
	page := string(readAll(t, resp))
	if resp.StatusCode != 503 || !strings.Contains(page, "may or may not have been made") || !strings.Contains(page, "never makes a second key") {
		t.Fatalf("a key form NATS refused: %d %s, want 503 saying the key may or may not have been made", resp.StatusCode, page)
	}
	if !strings.Contains(g.log.String(), "no response from stream") {
		t.Fatalf("the log does not say why: %s", g.log.String())
	}
}
