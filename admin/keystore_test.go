package admin_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/accounts"
)

// A key whose write the store did not confirm (NATS electing a leader, or
// without a quorum until the 10 s ran out) may have been made all the
// same: with 2 of 3 nodes down one was, listed once they were back, its
// secret never shown, and the "try again" of the 503 made a second key.
// The 503 names the key and where to find it. The bucket is deleted so
// that the write meets no stream, as it does while one has no leader.
func TestCreateKeyTheStoreDidNotConfirmNamesTheKey(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	if err := g.js.DeleteKeyValue(t.Context(), accounts.BucketKeys); err != nil {
		t.Fatal(err)
	}
	status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci"}`)
	if status != 503 {
		t.Fatalf("a key the store refused: %d %s, want 503", status, body)
	}
	message := wantError(t, body, "", "upstream_unavailable")
	keyID := regexp.MustCompile(`key_[A-Za-z0-9]+`).FindString(message)
	for _, want := range []string{"may have been made", "GET /admin/v1/accounts/acme/keys", "DELETE /admin/v1/keys/" + keyID} {
		if keyID == "" || !strings.Contains(message, want) {
			t.Fatalf("the 503 of a key the store refused: %q, want it to name the key and say %q", message, want)
		}
	}
}
