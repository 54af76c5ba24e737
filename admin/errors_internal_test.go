package admin

import (
	"errors"
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
)

// An account store that fails (NATS electing a leader) is a 503 the
// operator may retry, never a 400 saying the request was wrong.
func TestStoreFailureIs503(t *testing.T) {
	for err, want := range map[error]int{
		errors.New("revoking key key_1: nats: no response from stream"):              503,
		fmt.Errorf("%w: rpm and tpm must not be negative", accounts.ErrInvalidInput): 400,
		fmt.Errorf("account x: %w", accounts.ErrNotFound):                            404,
		fmt.Errorf("account x: %w", accounts.ErrExists):                              409,
	} {
		var ctx fasthttp.RequestCtx
		writeError(&ctx, err)
		if got := ctx.Response.StatusCode(); got != want {
			t.Errorf("%v: status %d, want %d", err, got, want)
		}
	}
}
