//go:build !race

package accounts

import (
	"testing"

	"github.com/tollgate/tollgate/money"
)

// The request path must not allocate once a key is cached.
func TestHotPathDoesNotAllocate(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	info, token, err := s.CreateKey(ctx, "acme", KeyRequest{Scopes: []string{ScopeGenerate}})
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(token)
	if _, err := s.Verify(raw); err != nil {
		t.Fatal(err)
	}
	for name, fn := range map[string]func(){
		"Verify cached":         func() { _, _ = s.Verify(raw) },
		"Balance":               func() { _, _ = s.Balance("acme") },
		"KeyInfo":               func() { _, _ = s.KeyInfo(info.KeyID) },
		"Verify without prefix": func() { _, _ = s.Verify(raw[len(TokenPrefix):]) },
	} {
		if n := testing.AllocsPerRun(200, fn); n != 0 {
			t.Errorf("%s: %.1f allocations per call, want 0", name, n)
		}
	}
}
