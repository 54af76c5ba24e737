// Package console is the account holder's web console at /console: the
// balance, usage of the last 30 days from ClickHouse, and API keys (create,
// shown once; list without secrets; delete).
//
// It is server-rendered HTML (html/template) with embedded CSS and one small
// inline script for the Copy button; nothing is fetched from elsewhere, and
// every page works without JavaScript. There are no passwords: the operator
// issues a one-time sign-in link (admin API POST
// /admin/v1/accounts/{id}/console-login, or `tollgate accounts login ID`),
// which the holder exchanges for a session. The session is a signed,
// expiring cookie, so gateways keep no session state.
//
// The routes register themselves in init(): the pages with proxy.Register,
// console-login with admin.Register, so neither proxy nor admin names the
// console, and the sign-in links are issued where they are redeemed.
// Configure makes them serve. The key form is checked by
// admin.CheckKeyRequest, the same rules the admin API applies.
package console
