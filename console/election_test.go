package console

import (
	"encoding/json"
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

// A sign-in link NATS could not store (an election) was a 500
// internal_error; the admin API answers its other writes refused so with
// a 503 to send again, and nothing of a link was made.
func TestConsoleLoginRefusedByNATSIsSendItAgain(t *testing.T) {
	g := startGateway(t, "")
	if err := g.broker.JetStream().DeleteKeyValue(t.Context(), BucketLogins); err != nil {
		t.Fatal(err)
	}
	resp := g.admin("POST", "/admin/v1/accounts/acme/console-login")
	body := readAll(t, resp)
	var answer struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		t.Fatalf("%d %s: %v", resp.StatusCode, body, err)
	}
	if resp.StatusCode != 503 || answer.Error.Code != "upstream_unavailable" || !strings.Contains(answer.Error.Message, "send it again") {
		t.Fatalf("console-login NATS refused: %d %s, want 503 upstream_unavailable saying to send it again", resp.StatusCode, body)
	}
}
