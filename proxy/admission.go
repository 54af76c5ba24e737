package proxy

// Admission: who may make a generation call, before any of it is read.

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/money"
)

// authenticate verifies the bearer key. Every failure is 401 INVALID_API_KEY
// with the reason, never which part of a forged key was wrong beyond that.
// authorize is authenticate, then a check that the key has scope.
func (s *Server) authorize(ctx *fasthttp.RequestCtx, scope string) (*accounts.Key, *APIError) {
	key, apiErr := s.authenticate(ctx)
	if apiErr != nil {
		return nil, apiErr
	}
	if scope != "" && !key.HasScope(scope) {
		return nil, Forbidden("this API key lacks the " + scope + " scope")
	}
	return key, nil
}

func (s *Server) authenticate(ctx *fasthttp.RequestCtx) (*accounts.Key, *APIError) {
	h := ctx.Request.Header.Peek("Authorization")
	if len(h) == 0 {
		return nil, errInvalidKey("missing API key: send the header Authorization: Bearer <API key>")
	}
	if len(h) < 7 || !strings.EqualFold(string(h[:7]), "bearer ") {
		return nil, errInvalidKey("the Authorization header must be: Bearer <API key>")
	}
	key, err := s.accounts.Verify(bytes.TrimSpace(h[7:]))
	if err != nil {
		return nil, errInvalidKey(err.Error())
	}
	return key, nil
}

// CanPay says whether account can spend cost without its balance going
// below the grace buffer: for work billed at its end, a batch job, whose
// cost is known before it runs. An account this process does not know
// (yet: balances arrive by a KV watch) is not refused here; its key was
// checked when the job was created and started.
func (s *Server) CanPay(account string, cost money.Nanos) (money.Nanos, bool) {
	if s.accounts == nil {
		return 0, true // no accounts to ask (a server built without them)
	}
	bal, ok := s.accounts.Balance(account)
	return bal, !ok || bal-cost >= -s.world.Load().grace
}

// NoteCharge counts cost, billed to account by this process's own meter
// (a batch job's bill), against the balance calls are admitted on until
// the account's debits show it, as Record does for the events it takes.
func (s *Server) NoteCharge(account string, cost money.Nanos) {
	if s.accounts != nil {
		s.accounts.NoteCharge(account, cost)
	}
}

// Debited is the sum of account's debits as this gateway last saw it;
// false without accounts, or for one it has not seen.
func (s *Server) Debited(account string) (money.Nanos, bool) {
	if s.accounts == nil {
		return 0, false
	}
	return s.accounts.Debited(account)
}

// checkBalance refuses accounts whose balance is below the grace buffer.
func (s *Server) checkBalance(w *World, key *accounts.Key) *APIError {
	_, _, apiErr := s.checkStanding(w, key)
	return apiErr
}

// checkStanding is checkBalance, and answers the account's limits and Live
// too, read with its balance in one look-up.
func (s *Server) checkStanding(w *World, key *accounts.Key) (accounts.Limits, *accounts.Live, *APIError) {
	bal, limits, live, ok := s.accounts.Standing(key.Account)
	if !ok {
		return limits, nil, errInvalidKey("the account of this API key does not exist")
	}
	if bal < -w.grace {
		// The grace as the console says it, an allowance past zero: "below
		// the grace buffer of -0.001000000 USD" read as a negative grace.
		return limits, live, errInsufficientBalance(fmt.Sprintf("account %s has a balance of %s USD, past the grace allowance of %s USD; a top-up resumes service at once", key.Account, bal, w.grace))
	}
	return limits, live, nil
}

// accountLimits is the limits and Live of account, none without accounts.
func (s *Server) accountLimits(account string) (accounts.Limits, *accounts.Live) {
	if s.accounts == nil {
		return accounts.Limits{}, nil
	}
	_, limits, live, _ := s.accounts.Standing(account)
	return limits, live
}

// admit checks the key, its scope and its account's balance, and counts
// the call against the key's own rpm/tpm and its account's limits: the
// request, one of the account's calls in flight (its max_concurrent, if
// any) and an estimate of its prompt now, settled to its usage once that
// is known. The admission is a value the call keeps, so admitting
// allocates nothing.
func (s *Server) admit(ctx *fasthttp.RequestCtx, w *World) (*accounts.Key, admission, *APIError) {
	key, apiErr := s.authorize(ctx, accounts.ScopeGenerate)
	if apiErr != nil {
		return nil, admission{}, apiErr
	}
	acct, live, apiErr := s.checkStanding(w, key)
	if apiErr != nil {
		return nil, admission{}, apiErr
	}
	limit := s.limits.generationAdmission(key, acct, live, true)
	var estimate int64
	if tpm := limit.tokenLimit(); tpm > 0 {
		estimate = promptEstimate(ctx.PostBody(), tpm)
	}
	if apiErr := limit.admit(ctx, estimate); apiErr != nil {
		return nil, admission{}, apiErr
	}
	return key, limit, nil
}
