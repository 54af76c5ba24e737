// Package admin is the admin API under /admin/v1: accounts, credit, API
// keys and upstream status, in JSON, behind the admin bearer token. The
// CLI (`tollgate accounts`, `tollgate keys`) and operators call it.
//
// It is its own package, outside proxy, so the request path does not carry
// the account-management code and the console does not reach into proxy
// for it. proxy.Server knows it only as a proxy.AdminHandler; what it
// needs from the gateway it reads from the proxy.World of the call (the
// catalog, the upstreams' status), and errors use proxy's envelope so
// client libraries raise the right exception.
//
// Modules of the server (proxy.Module) add admin routes of their own
// (proxy.Provisioned.AdminRoutes), which the server hands to ServeAdmin
// with each call: the console serves its sign-in links
// (accounts/{id}/console-login) that way, so this package never names the
// console. CheckKeyRequest is the one validation of a key request, shared
// with the console's key form.
package admin
