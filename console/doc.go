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
// expiring cookie, so gateways keep no session state; what ends one early
// (sign-out, or the operator's console-logout of a whole account) is
// shared through a JetStream bucket every gateway watches.
//
// Open builds the console; Console.Module is it as a module of a
// proxy.Server, which cmd/tollgate lists among the server's modules: each
// provisioning serves the pages and adds console-login and console-logout
// to the admin API
// (Provisioned.AdminRoutes), so neither proxy nor admin names the console,
// and the sign-in links are issued where they are redeemed. The key form
// is checked by admin.CheckKeyRequest, the same rules the admin API
// applies.
package console
