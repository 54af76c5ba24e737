package admin

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
)

type accountView struct {
	ID          string    `json:"id"`
	BalanceUSD  string    `json:"balance_usd"`
	CreditedUSD string    `json:"credited_usd"`
	DebitedUSD  string    `json:"debited_usd"`
	CreatedAt   time.Time `json:"created_at"`
	accounts.Limits
}

func viewAccount(acc accounts.Account) accountView {
	return accountView{ID: acc.ID, BalanceUSD: acc.Balance.String(), CreditedUSD: acc.Credited.String(),
		DebitedUSD: acc.Debited.String(), CreatedAt: answeredTime(acc.CreatedAt), Limits: acc.Limits}
}

// answeredTime is a time as the admin API answers every one: UTC, in
// whole seconds, the precision of a key's created_at and expires_at,
// which its token carries. An account's created_at and a key's
// revoked_at had nanoseconds beside them. Stored times keep theirs: the
// records of every release read the same, and keys revoked in one second
// are still listed in the order they were.
func answeredTime(t time.Time) time.Time { return t.UTC().Truncate(time.Second) }

// viewKey is info with its times as answeredTime makes them.
func viewKey(info accounts.KeyInfo) accounts.KeyInfo {
	info.CreatedAt = answeredTime(info.CreatedAt)
	for _, t := range []**time.Time{&info.ExpiresAt, &info.RevokedAt} {
		if *t != nil {
			answered := answeredTime(**t)
			*t = &answered
		}
	}
	return info
}

// checkLimit refuses a negative limit, naming its field.
func checkLimit(field string, v int64) error {
	if v < 0 {
		return proxy.BadRequest(field, fmt.Sprintf("%s must not be negative, got %d (0 = no limit)", field, v))
	}
	return nil
}

// usdSign is which amounts a USD field takes.
type usdSign int

const (
	usdNotNegative usdSign = iota // an account's first credit
	usdNotZero                    // a credit, or below zero its correction
)

// parseUSDField reads the USD amount of a body's field: the decimal
// alone, as gateway.yaml takes it. money.ParseUSD trims spaces and reads
// a '+', so " 1.00", "1.00\n" and "+1" were credited unseen.
func parseUSDField(field, s string, sign usdSign) (money.Nanos, error) {
	var n money.Nanos
	var err error
	switch {
	case strings.TrimSpace(s) != s:
		err = fmt.Errorf("USD amount %q: starts or ends with whitespace: remove it", s)
	case strings.HasPrefix(s, "+"):
		err = fmt.Errorf("USD amount %q: starts with '+': write the number without a sign", s)
	default:
		n, err = money.ParseUSD(s)
	}
	switch {
	case err != nil:
	case sign == usdNotNegative && n < 0:
		err = errors.New("must not be negative")
	case sign == usdNotZero && n == 0:
		err = errors.New("must not be zero: a positive amount credits, a negative one corrects credits made before")
	}
	if err != nil {
		return 0, proxy.BadRequest(field, fmt.Sprintf("%s: %v (write USD as a decimal string such as \"10.00\")", field, err))
	}
	return n, nil
}

func (a *API) createAccount(call *Call) (int, any, error) {
	var req struct {
		ID        string  `json:"id"`
		CreditUSD *string `json:"credit_usd"`
		// Not accounts.Limits embedded: checkMembers reads the fields
		// of this struct only, and would let "RPM" through.
		RPM           int64 `json:"rpm"`
		TPM           int64 `json:"tpm"`
		MaxConcurrent int64 `json:"max_concurrent"`
	}
	if err := decodeStrict(call.HTTP, &req); err != nil {
		return 0, nil, err
	}
	if req.ID == "" {
		return 0, nil, proxy.BadRequest("id", "id is required")
	}
	if err := accounts.ValidateAccountID(req.ID); err != nil {
		return 0, nil, fieldError("id", err)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"rpm", req.RPM}, {"tpm", req.TPM}, {"max_concurrent", req.MaxConcurrent}} {
		if err := checkLimit(f.name, f.v); err != nil {
			return 0, nil, err
		}
	}
	credit := money.Nanos(0)
	if req.CreditUSD != nil {
		// "" is no amount: a payment integration's empty value made an
		// account with no credit, saying nothing.
		if *req.CreditUSD == "" {
			return 0, nil, proxy.BadRequest("credit_usd", `credit_usd is empty: give an amount such as "10.00", or leave the field out for an account with no credit`)
		}
		var err error
		if credit, err = parseUSDField("credit_usd", *req.CreditUSD, usdNotNegative); err != nil {
			return 0, nil, err
		}
	}
	acc, err := a.svc.CreateAccountWithLimits(call.Ctx, req.ID, credit,
		accounts.Limits{RPM: req.RPM, TPM: req.TPM, MaxConcurrent: req.MaxConcurrent})
	if errors.Is(err, accounts.ErrExists) {
		return 0, nil, fieldError("id", err)
	}
	if err != nil {
		return 0, nil, err
	}
	return 201, viewAccount(acc), nil
}

// updateAccount sets the limits the body names and keeps the others.
func (a *API) updateAccount(call *Call) (int, any, error) {
	var req struct {
		RPM           *int64 `json:"rpm"`
		TPM           *int64 `json:"tpm"`
		MaxConcurrent *int64 `json:"max_concurrent"`
	}
	if err := decodeStrict(call.HTTP, &req); err != nil {
		// The balance moves by credits alone, each kept with its
		// idempotency key: say where they go, as a PATCH cannot.
		if apiErr, ok := err.(*proxy.APIError); ok && slices.Contains(balanceFields, apiErr.Param) {
			apiErr.Message += `; credit an account with POST /admin/v1/accounts/{id}/credit {"usd":"10.00"}`
		}
		return 0, nil, err
	}
	fields := []struct {
		name string
		v    *int64
	}{{"rpm", req.RPM}, {"tpm", req.TPM}, {"max_concurrent", req.MaxConcurrent}}
	for _, f := range fields {
		if f.v == nil {
			continue
		}
		if err := checkLimit(f.name, *f.v); err != nil {
			return 0, nil, err
		}
	}
	acc, err := a.svc.SetLimits(call.Ctx, call.Args[0], func(l *accounts.Limits) {
		for _, f := range []struct {
			from *int64
			to   *int64
		}{{req.RPM, &l.RPM}, {req.TPM, &l.TPM}, {req.MaxConcurrent, &l.MaxConcurrent}} {
			if f.from != nil {
				*f.to = *f.from
			}
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return 200, viewAccount(acc), nil
}

func (a *API) getAccount(call *Call) (int, any, error) {
	acc, err := a.svc.Account(call.Ctx, call.Args[0])
	if err != nil {
		return 0, nil, err
	}
	return 200, viewAccount(acc), nil
}

// A page of GET /admin/v1/accounts holds defaultAccountsPage accounts
// unless limit says otherwise, and at most maxAccountsPage: each is one
// read of the account store.
const (
	defaultAccountsPage = 100
	maxAccountsPage     = 1000
)

// accountList is a page of GET /admin/v1/accounts in the shape of OpenAI's
// paginated lists: ask again with after=last_id while has_more.
type accountList struct {
	Object  string        `json:"object"`
	Data    []accountView `json:"data"`
	FirstID *string       `json:"first_id"`
	LastID  *string       `json:"last_id"`
	HasMore bool          `json:"has_more"`
}

// listAccounts answers the accounts sorted by id, each as getAccount
// shows it: the ids come from this gateway's snapshot, the accounts from
// the store, as the snapshot holds neither created_at nor credited_usd.
func (a *API) listAccounts(call *Call) (int, any, error) {
	limit, after, err := accountsQuery(call.HTTP.QueryArgs())
	if err != nil {
		return 0, nil, err
	}
	ids, err := a.svc.AccountIDs(call.Ctx, after)
	if err != nil {
		return 0, nil, err
	}
	page := accountList{Object: "list", Data: []accountView{}}
	for len(ids) > 0 && len(page.Data) < limit {
		acc, err := a.svc.Account(call.Ctx, ids[0])
		ids = ids[1:]
		if errors.Is(err, accounts.ErrNotFound) {
			// Deleted from the bucket by hand since the snapshot listed it.
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		page.Data = append(page.Data, viewAccount(acc))
	}
	page.HasMore = len(ids) > 0
	if n := len(page.Data); n > 0 {
		page.FirstID, page.LastID = &page.Data[0].ID, &page.Data[n-1].ID
	}
	return 200, page, nil
}

// accountsQuery reads the query string of GET /admin/v1/accounts: limit
// and after. ServeAdmin refused any other parameter and one given twice
// (checkQuery).
func accountsQuery(args *fasthttp.Args) (limit int, after string, err error) {
	limit = defaultAccountsPage
	for key, value := range args.All() {
		name, v := string(key), string(value)
		switch name {
		case "limit":
			// Decimal digits alone, as the CLI reads numbers: Atoi takes
			// "+5" and "010".
			n, convErr := strconv.Atoi(v)
			if !pageLimit.MatchString(v) || convErr != nil || n > maxAccountsPage {
				return 0, "", proxy.BadRequest("limit", fmt.Sprintf("limit must be a whole number from 1 to %d, got %q (leave it out for %d)", maxAccountsPage, v, defaultAccountsPage))
			}
			limit = n
		case "after":
			if v == "" {
				return 0, "", proxy.BadRequest("after", "after is empty: give the last_id of the page before, or leave it out for the first page")
			}
			if err := accounts.ValidateAccountID(v); err != nil {
				return 0, "", fieldError("after", err)
			}
			after = v
		}
	}
	return limit, after, nil
}

var pageLimit = regexp.MustCompile(`^[1-9][0-9]{0,3}$`)

func (a *API) credit(call *Call) (int, any, error) {
	var req struct {
		USD *string `json:"usd"`
		// IdempotencyKey makes a credit sent twice (a retried call, a
		// payment webhook delivered again) apply once.
		IdempotencyKey *string `json:"idempotency_key"`
	}
	if err := decodeStrict(call.HTTP, &req); err != nil {
		return 0, nil, err
	}
	// Left out, it was read as "" and refused as "not a plain decimal
	// number", as if one had been sent.
	const example = `give an amount such as "10.00" (a negative one corrects credits made before)`
	switch {
	case req.USD == nil:
		return 0, nil, proxy.BadRequest("usd", "usd is required: "+example)
	case *req.USD == "":
		return 0, nil, proxy.BadRequest("usd", "usd is empty: "+example)
	}
	// Negative, it corrects a credit typed wrong (see
	// accounts.CreditOnce), which nothing could take back before.
	amount, err := parseUSDField("usd", *req.USD, usdNotZero)
	if err != nil {
		return 0, nil, err
	}
	var key string
	if req.IdempotencyKey != nil {
		key = *req.IdempotencyKey
		if err := checkIdempotencyKey(key); err != nil {
			return 0, nil, err
		}
	}
	// The path's id first: what CreditOnce refuses after it, the amount
	// and key being checked above, is the balance's overflow.
	if err := accounts.ValidateAccountID(call.Args[0]); err != nil {
		return 0, nil, err
	}
	acc, replayed, err := a.svc.CreditOnce(call.Ctx, call.Args[0], amount, key)
	switch {
	case errors.Is(err, accounts.ErrInvalidInput):
		return 0, nil, fieldError("usd", err)
	case errors.Is(err, accounts.ErrExists):
		// The key was used for a credit of another amount.
		return 0, nil, fieldError("idempotency_key", err)
	case err != nil:
		return 0, nil, err
	}
	if replayed {
		// Stripe's header: the credit was applied before, not now.
		call.HTTP.Response.Header.Set("Idempotent-Replayed", "true")
	}
	return 200, viewAccount(acc), nil
}

// checkIdempotencyKey refuses a key sent empty, which the store reads as
// none (a payment integration whose ids mapped to "" credited each one),
// a key over the store's bound, one with whitespace at its ends, and a
// control character (C0, DEL, C1), which no log or 409 would show as it
// is.
func checkIdempotencyKey(key string) error {
	switch {
	case key == "":
		return proxy.BadRequest("idempotency_key", "idempotency_key is empty: give the payment's id, or leave the field out to credit without one")
	case len(key) > accounts.MaxIdempotencyKey:
		return proxy.BadRequest("idempotency_key", fmt.Sprintf("idempotency_key is too long: at most %d bytes", accounts.MaxIdempotencyKey))
	case strings.TrimSpace(key) != key:
		// " pay_1" and "pay_1" were two keys: a payment id sent once with
		// a stray space was credited twice.
		return proxy.BadRequest("idempotency_key", fmt.Sprintf("idempotency_key %q starts or ends with whitespace: send the id without it", key))
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return proxy.BadRequest("idempotency_key", fmt.Sprintf("idempotency_key %q holds a control character: send the id as printable text", key))
	}
	return nil
}

// keyBody is POST /admin/v1/accounts/{id}/keys as sent. Scopes and
// Models take null: all of them, as the key object shows it (and the CLI
// sends it for a flag left out).
type keyBody struct {
	Name      string   `json:"name"`
	Scopes    []string `json:"scopes" null:"ok"`
	Models    []string `json:"models" null:"ok"`
	RPM       int64    `json:"rpm"`
	TPM       int64    `json:"tpm"`
	ExpiresIn *string  `json:"expires_in"` // Go duration, e.g. "720h"
	Logging   *struct {
		Enabled       bool `json:"enabled"`
		RetentionDays int  `json:"retention_days"`
	} `json:"logging"`
}

// wellFormedDuration is what time.ParseDuration reads when the value fits
// an int64 of nanoseconds: such a string it refuses is too long.
var wellFormedDuration = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

func (a *API) createKey(call *Call) (int, any, error) {
	var body keyBody
	if err := decodeStrict(call.HTTP, &body); err != nil {
		return 0, nil, err
	}
	req := accounts.KeyRequest{Name: body.Name, Scopes: body.Scopes, Models: body.Models, RPM: body.RPM, TPM: body.TPM}
	if body.ExpiresIn != nil {
		expiresIn := *body.ExpiresIn
		d, err := time.ParseDuration(expiresIn)
		switch {
		case expiresIn == "":
			// It made a key that never expires, where a script whose
			// variable was unset meant one that does.
			return 0, nil, proxy.BadRequest("expires_in", `expires_in is empty: give a lifetime such as "720h", or leave the field out for a key that never expires`)
		case err != nil && wellFormedDuration.MatchString(expiresIn), err == nil && d > accounts.MaxKeyLifetime:
			// Said to be "not positive", "100000000h" sent the admin
			// looking for a sign. One bound for both: past it but within
			// a duration, the key's expiry overflowed into 1734.
			return 0, nil, proxy.BadRequest("expires_in", fmt.Sprintf("expires_in %q is longer than a key can live (at most %.0fh, about 292 years); leave it out for a key that never expires", expiresIn, accounts.MaxKeyLifetime.Hours()))
		case err != nil:
			return 0, nil, proxy.BadRequest("expires_in", fmt.Sprintf("expires_in %q is not a duration: give a number with a unit of h, m or s, such as \"720h\" for 30 days (there is no d)", expiresIn))
		case d <= 0:
			return 0, nil, proxy.BadRequest("expires_in", "expires_in must be a positive duration such as \"720h\"")
		}
		if d < time.Second {
			// Expiry is in whole seconds: "1ns" made a key dead on arrival.
			return 0, nil, proxy.BadRequest("expires_in", fmt.Sprintf("expires_in %s is under a second, the finest an expiry is kept at; give at least \"1s\"", d))
		}
		req.ExpiresIn = d
	}
	if body.Logging != nil {
		req.Logging = accounts.Logging{Enabled: body.Logging.Enabled, RetentionDays: body.Logging.RetentionDays}
	}
	if p := CheckKeyRequest(req, call.World.Catalog); p != nil {
		return 0, nil, proxy.BadRequest(p.Field, p.Message)
	}
	req.MaxKeys = call.World.Config.Auth.MaxKeysPerAccount
	info, token, err := a.svc.CreateKey(call.Ctx, call.Args[0], req)
	if errors.Is(err, accounts.ErrTooManyKeys) {
		return 0, nil, proxy.LimitReached("too_many_keys", err.Error()+": revoke a key the account no longer uses (DELETE /admin/v1/keys/{key_id}; an expired key counts until it is revoked), or raise the setting")
	}
	var unconfirmed *accounts.KeyStoreError
	if errors.As(err, &unconfirmed) {
		// "Try again" alone made a second key when the first had landed
		// (the admin API takes no idempotency key for keys).
		return 0, nil, proxy.Unavailable(fmt.Sprintf("the account store did not confirm the new key (%v): key %s may have been made, its secret never shown. Once NATS answers again, GET /admin/v1/accounts/%s/keys lists it if it was made: revoke it (DELETE /admin/v1/keys/%s) if you send this request again, which makes another key",
			unconfirmed.Err, unconfirmed.KeyID, call.Args[0], unconfirmed.KeyID))
	}
	if err != nil {
		return 0, nil, err
	}
	return 201, struct {
		accounts.KeyInfo
		Key string `json:"key"`
	}{viewKey(info), token}, nil
}

func (a *API) listKeys(call *Call) (int, any, error) {
	account := call.Args[0]
	if _, err := a.svc.Account(call.Ctx, account); err != nil {
		return 0, nil, err
	}
	keys, err := a.svc.ListKeys(call.Ctx, account)
	if err != nil {
		return 0, nil, err
	}
	if keys == nil {
		keys = []accounts.KeyInfo{}
	}
	for i := range keys {
		keys[i] = viewKey(keys[i])
	}
	return 200, struct {
		Object string             `json:"object"`
		Data   []accounts.KeyInfo `json:"data"`
	}{"list", keys}, nil
}

// getKey answers a key as its element of GET /admin/v1/accounts/{id}/keys
// shows it, its account included: a key id seen in a log, revoked or not,
// is looked up without ClickHouse.
func (a *API) getKey(call *Call) (int, any, error) {
	info, err := a.svc.LookupKey(call.Ctx, call.Args[0])
	if err != nil {
		return 0, nil, err
	}
	return 200, viewKey(info), nil
}

func (a *API) revokeKey(call *Call) (int, any, error) {
	// It takes no fields: "-d garbage" revoked the key and answered 200.
	if err := decodeStrict(call.HTTP, &struct{}{}); err != nil {
		return 0, nil, err
	}
	info, err := a.svc.RevokeKey(call.Ctx, call.Args[0])
	if err != nil {
		return 0, nil, err
	}
	return 200, struct {
		accounts.KeyInfo
		Revoked bool `json:"revoked"`
	}{viewKey(info), true}, nil
}

// balanceFields are the names a PATCH of an account's balance is sent
// under: the create route's field, the credit route's, and the account's
// own answer's.
var balanceFields = []string{"credit_usd", "usd", "credit", "balance_usd", "balance"}
